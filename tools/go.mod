// The lint tools, pinned by this go.mod and go.sum and kept out of the
// router's own module so that its dependency graph stays its own.
// scripts/install-tools.sh builds them into bin/tools; make lint runs them.
// To upgrade: go get -tool honnef.co/go/tools/cmd/staticcheck@vX.Y.Z, and
// keep golang.org/x/tools at the version that staticcheck requires.
module github.com/kvfast/kvfast/tools

go 1.26.0

tool (
	github.com/kvfast/kvfast/tools/kubeschema
	github.com/kvfast/kvfast/tools/unreached
	github.com/yannh/kubeconform/cmd/kubeconform
	honnef.co/go/tools/cmd/staticcheck
)

require (
	golang.org/x/tools v0.51.0
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/BurntSushi/toml v1.4.1-0.20240526193622-a339e1f7089c // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/hashicorp/go-retryablehttp v0.7.7 // indirect
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.1 // indirect
	github.com/yannh/kubeconform v0.7.0 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/exp/typeparams v0.0.0-20231108232855-2478ac86f678 // indirect
	golang.org/x/mod v0.41.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/text v0.25.0 // indirect
	honnef.co/go/tools v0.8.2 // indirect
)
