// Test equipment, never shipped: csi-sanity, the CSI conformance suite, at a
// pinned version, built from the Go module proxy by ../build. A module of
// its own: it needs CSI spec v1.13, which Kubernetes 1.36 does not build with.
module github.com/ballast-csi/ballast/tools/k8s/csi-test

go 1.26.0

tool github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity

require (
	github.com/Masterminds/semver/v3 v3.4.0 // indirect
	github.com/container-storage-interface/spec v1.13.0 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/go-task/slim-sprig/v3 v3.0.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/google/pprof v0.0.0-20260402051712-545e8a4df936 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/kubernetes-csi/csi-test/v5 v5.6.0 // indirect
	github.com/onsi/ginkgo/v2 v2.32.1 // indirect
	github.com/onsi/gomega v1.42.1 // indirect
	go.uber.org/mock v0.6.0 // indirect
	go.yaml.in/yaml/v3 v3.0.4 // indirect
	golang.org/x/mod v0.36.0 // indirect
	golang.org/x/net v0.56.0 // indirect
	golang.org/x/sync v0.21.0 // indirect
	golang.org/x/sys v0.46.0 // indirect
	golang.org/x/text v0.38.0 // indirect
	golang.org/x/tools v0.45.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260526163538-3dc84a4a5aaa // indirect
	google.golang.org/grpc v1.83.1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
)
