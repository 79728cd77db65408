//! Sizes as people write them: `1073741824`, `1Gi`, `512Mi`, `10G`.
//!
//! Binary suffixes (Ki, Mi, Gi, Ti, Pi) are powers of 1024, decimal ones
//! (K, M, G, T, P) powers of 1000, as in Kubernetes quantities.

use serde::{Deserialize, Deserializer, Serializer};

/// Parses a size in bytes. The error says what was wrong.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty size".into());
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    if digits.is_empty() {
        return Err(format!("size {text:?} does not start with a number"));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("size {text:?} is too large"))?;
    let mult: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        other => {
            return Err(format!(
                "size {text:?} has unknown suffix {other:?} (accepted: Ki, Mi, Gi, Ti, Pi, K, M, G, T, P)"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {text:?} is too large"))
}

/// Formats bytes with the largest binary suffix that divides them, or as
/// a rounded figure for display when none does.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 5] = [
        ("Pi", 1 << 50),
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    for (name, size) in UNITS {
        if bytes >= size {
            if bytes.is_multiple_of(size) {
                return format!("{}{name}", bytes / size);
            }
            return format!("{:.1}{name}", bytes as f64 / size as f64);
        }
    }
    format!("{bytes}")
}

/// serde: accepts a size as an integer or as a quantity string; writes an integer.
/// The schema of a size in a Kubernetes object: bytes as an integer, or a
/// quantity string such as "10Gi", as serde_size reads both.
pub fn size_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "anyOf": [{ "type": "integer", "minimum": 0 }, { "type": "string" }]
    })
}

pub mod serde_size {
    use super::*;

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(*v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            N(u64),
            S(String),
        }
        match Either::deserialize(d)? {
            Either::N(n) => Ok(n),
            Either::S(s) => parse_size(&s).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_suffixes() {
        assert_eq!(parse_size("1Gi"), Ok(1 << 30));
        assert_eq!(parse_size("512Mi"), Ok(512 << 20));
        assert_eq!(parse_size("10G"), Ok(10_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
    }

    #[test]
    fn rejects_bad_sizes_with_a_reason() {
        assert!(parse_size("").is_err());
        assert!(parse_size("Gi").unwrap_err().contains("number"));
        assert!(parse_size("1Qi").unwrap_err().contains("suffix"));
        assert!(parse_size("99999999999Pi").unwrap_err().contains("large"));
    }

    #[test]
    fn formats_sizes() {
        assert_eq!(format_size(1 << 30), "1Gi");
        assert_eq!(format_size(1536 << 20), "1.5Gi");
        assert_eq!(format_size(100), "100");
    }
}

/// serde: like [`serde_size`] for an optional field (use with `default`).
pub mod serde_size_opt {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        serde_size::deserialize(d).map(Some)
    }
}
