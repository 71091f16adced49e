# kvfast: run `make` (or `make help`) to list the targets.
.DEFAULT_GOAL := help
GO        ?= go
BIN       := bin/kvfast
PKGS      := ./...
FUZZTIME  ?= 20s
BENCHTIME ?= 1s

SOAK_DURATION ?= 30m
IMAGE         ?= kvfast:latest

.PHONY: help build image test test-short bench fuzz lint manifests demo soak clean

help: ## List the targets with what they do.
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_-]+:.*## /{printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## Build bin/kvfast.
	$(GO) build -buildvcs=auto -o $(BIN) ./cmd/kvfast

image: ## Build the container image IMAGE (default kvfast:latest, the tag deploy/kubernetes runs) from the Dockerfile; needs Docker (docs/deploy.md).
	@command -v docker >/dev/null 2>&1 || { echo "make image: docker is not installed; make lint checks the Dockerfile without it" >&2; exit 1; }
	docker build --build-arg KVFAST_VERSION=$$(git describe --always --dirty 2>/dev/null) -t $(IMAGE) .

test: lint ## Everything CI runs: lint, set-up, the whole suite under the race detector, the tokenizer's differential tests and the index-damage test without it, the manifests' check, and a two-minute soak.
	@./scripts/setup-test-deps.sh
	$(GO) test -race -count=1 -timeout 20m $(PKGS)
	KVFAST_SWEEP=sample $(GO) test -count=1 -timeout 20m -run '^(TestCodePointSweep|TestExactAgainstReference|TestVariantsAgainstReference|TestCutsKeepIDs)$$' ./tokenizer
	$(GO) test -count=1 -run '^TestDamageWhileIngestingIsMended$$' ./feed
	$(GO) -C tools test -count=1 ./...
	@GO=$(GO) ./scripts/check-manifests.sh
	KVFAST_SOAK=2m $(GO) test -count=1 -timeout 10m -run '^TestSoak$$' -v ./benchmarks/soak

test-short: ## The suite without the race detector, for a fast local loop.
	$(GO) test -count=1 -short $(PKGS)

bench: ## All benchmarks once (BENCHTIME=1s by default); see BENCHMARKS.md for the recorded runs.
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) $(PKGS)

fuzz: ## Each fuzz target for FUZZTIME (default 20s).
	@./scripts/fuzz-all.sh $(FUZZTIME)

lint: ## gofmt, go vet, staticcheck, and no code production never runs (tools pinned by tools/go.mod; see .deadcode-allow).
	@GO=$(GO) ./scripts/lint.sh

manifests: ## Validate the Kubernetes manifests (deploy/kubernetes) with kubeconform, strictly, against schemas generated offline from pinned modules.
	@GO=$(GO) ./scripts/check-manifests.sh

demo: ## Replay the Mooncake trace against 8 mock engines once per routing policy and compare them (about 2 min; DEMO_FLAGS=... adds flags).
	$(GO) run ./cmd/kvfast demo $(DEMO_FLAGS)

soak: ## Run a node under client, engine and router faults for SOAK_DURATION (default 30m), then check nothing leaked.
	$(GO) run ./cmd/kvfast soak --duration $(SOAK_DURATION)

clean: ## Remove build outputs.
	rm -rf bin
