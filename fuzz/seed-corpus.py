#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target into fuzz/corpus/<target>/.
Seeds are well-formed inputs (and a few near misses) for each parser, so
that libFuzzer starts from the shapes the parsers accept. Re-running it
rewrites the seeds only; inputs a fuzz run added are kept."""

import json
import pathlib
import shutil
import struct

ROOT = pathlib.Path(__file__).resolve().parent
CORPUS = ROOT / "corpus"


def seed(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / f"seed-{name}").write_bytes(data if isinstance(data, bytes) else data.encode())


# NBD (big-endian): client flags, then options.
IHAVEOPT = 0x49484156454F5054


def option(opt, data=b""):
    return struct.pack(">QII", IHAVEOPT, opt, len(data)) + data


def info_request(name):
    return struct.pack(">I", len(name)) + name + struct.pack(">H", 0)


flags = struct.pack(">I", 3)
seed("nbd_handshake", "go", flags + option(7, info_request(b"vol")))
seed("nbd_handshake", "list-info-go", flags + option(3) + option(6, info_request(b"")) + option(7, info_request(b"vol")))
seed("nbd_handshake", "export-name", flags + option(1, b"vol"))
seed("nbd_handshake", "abort", flags + option(2))
seed("nbd_handshake", "unknown-export", flags + option(7, info_request(b"other")) + option(2))
seed("nbd_handshake", "short-info", flags + option(6, b"\x00\x00") + option(99) + option(2))


def nbd_cmd(cmd, handle, offset, length, flags=0):
    return struct.pack(">IHHQQI", 0x25609513, flags, cmd, handle, offset, length)


size = struct.pack("<Q", 1 << 30)
seed("nbd_request", "read-write-flush", size + nbd_cmd(0, 1, 0, 4096) + nbd_cmd(1, 2, 4096, 65536, 1) + nbd_cmd(3, 3, 0, 0))
seed("nbd_request", "past-the-end", size + nbd_cmd(0, 4, (1 << 30) - 512, 4096) + nbd_cmd(4, 5, 2**64 - 1, 2**32 - 1))
seed("nbd_request", "bad-magic", size + b"\xff" * 28)


# Replica protocol (little-endian): magic, op, flags, id, offset, len, revision.
def frame(op, id_, offset, length, revision, flags=0):
    return struct.pack("<IBBxxQQI4xQ", 0x51455242, op, flags, id_, offset, length, revision)


seed("replica_frame", "read-write", frame(1, 1, 0, 4096, 0) + frame(2, 2, 4096, 65536, 7, 1))
seed("replica_frame", "open-join-fill", frame(8, 3, 0, 9, 0) + frame(9, 4, 0, 200, 0) + frame(10, 5, 0, 30, 0))
seed("replica_frame", "oversize-unknown", frame(2, 6, 0, 2**32 - 1, 0) + frame(200, 7, 0, 0, 0))
seed("replica_frame", "response", struct.pack("<IIQI4x", 0x50535242, 0, 9, 16))

# meta.json
meta = {
    "version": 1, "volume": "v", "size": 1 << 20, "blockSize": 4096,
    "chain": ["layer-000001.img", "layer-000002.img"],
    "frozen": {"layer-000001.img": "ab" * 32}, "revision": 42,
    "pending": ["layer-000001.img"], "blockSums": True,
}
seed("replica_meta", "good", json.dumps(meta))
seed("replica_meta", "traversal", json.dumps({**meta, "chain": ["../../etc/passwd"]}))
seed("replica_meta", "empty-chain", json.dumps({**meta, "chain": []}))
seed("replica_meta", "zero-block", json.dumps({**meta, "blockSize": 0}))

# Scenario YAML: the example and the controller's recorded cases.
repo = ROOT.parent
for p in sorted((repo / "examples" / "sim").glob("*.yaml")) + sorted((repo / "controller" / "tests" / "cases").glob("*.yaml"))[:8]:
    seed("scenario_yaml", p.stem, p.read_bytes())

# StorageClass parameters, one key=value per line.
seed("storage_class_params", "all", "numberOfReplicas=2\ndataLocality=best-effort\nreplicaAutoBalance=least-effort\nstaleReplicaTimeout=30\ndiskSelector=ssd, fast\nnodeSelector=storage\nfsType=xfs\nmkfsParams=-m 0\ncsi.storage.k8s.io/pvc/name=x\n")
seed("storage_class_params", "strict-local", "numberOfReplicas=1\ndataLocality=strict-local\n")
seed("storage_class_params", "bad", "numberOfReplicas=0\nunknownKey=1\n")

# A replica's directory, one file mangled: which file (0 meta.json, 1
# revision, 2 dirty-regions, 3 suspect-blocks, 4 corrupt-layers, 5
# engine-epoch, 6 and 7 the head's and the frozen layer's checksums, 8 and
# 9 their data), how (0 bytes over it, 1 cut, 2 replaced), the offset (u32,
# little-endian), then the bytes.
def mangled(which, how, offset, data=b""):
    return bytes([which, how]) + struct.pack("<I", offset) + data


for which, name in enumerate(["meta", "revision", "regions", "suspects", "marks", "fence", "head-sums", "frozen-sums", "head", "frozen"]):
    seed("replica_dir", f"{name}-over", mangled(which, 0, 8, b"\xff" * 16))
    seed("replica_dir", f"{name}-cut", mangled(which, 1, 4))
    seed("replica_dir", f"{name}-replaced", mangled(which, 2, 0, b"[18446744073709551615, 7]"))
seed("replica_dir", "revision-other-boot", mangled(1, 0, 16, b"\x01" * 16))
seed("replica_dir", "revision-huge-log-entry", mangled(1, 0, 64 + 9 * 32, struct.pack("<QQQQ", 9, 2**63, 2**63, 0)))
seed("replica_dir", "marks-head", mangled(4, 2, 0, b"layer-000002.img\n"))
# Checksums where each layer holds blocks: the head's of blocks 40 - 43,
# the frozen layer's of blocks 0 - 3 (4 bytes a block).
seed("replica_dir", "head-sums-held", mangled(6, 0, 160, b"\x00" * 16))
seed("replica_dir", "frozen-sums-held", mangled(7, 0, 0, b"\x00" * 16))
