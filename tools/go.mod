// The lint tools, pinned by this go.mod and go.sum and kept out of the
// router's own module so that its dependency graph stays its own.
// scripts/install-tools.sh builds them into bin/tools; make lint runs them.
// To upgrade: go get -tool honnef.co/go/tools/cmd/staticcheck@vX.Y.Z, and
// keep golang.org/x/tools at the version that staticcheck requires.
module github.com/kvfast/kvfast/tools

go 1.26.8

tool (
	github.com/kvfast/kvfast/tools/dockerfilecheck
	github.com/kvfast/kvfast/tools/kubeschema
	github.com/kvfast/kvfast/tools/unreached
	github.com/yannh/kubeconform/cmd/kubeconform
	honnef.co/go/tools/cmd/staticcheck
)

require (
	github.com/moby/buildkit v0.34.2
	golang.org/x/tools v0.51.0
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/BurntSushi/toml v1.4.1-0.20240526193622-a339e1f7089c // indirect
	github.com/agext/levenshtein v1.2.3 // indirect
	github.com/containerd/typeurl/v2 v2.3.0 // indirect
	github.com/docker/go-units v0.5.0 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/hashicorp/go-retryablehttp v0.7.8 // indirect
	github.com/moby/docker-image-spec v1.3.1 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/planetscale/vtprotobuf v0.6.1-0.20240319094008-0393e58bdf10 // indirect
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.1 // indirect
	github.com/tonistiigi/go-csvvalue v0.0.0-20240814133006-030d3b2625d0 // indirect
	github.com/yannh/kubeconform v0.7.0 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/exp/typeparams v0.0.0-20231108232855-2478ac86f678 // indirect
	golang.org/x/mod v0.41.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	honnef.co/go/tools v0.8.2 // indirect
)
