# hyperpodrun: build, test, benchmark and demo.
GO      ?= go
# No tags or GOFLAGS: a plain `go build ./...` / `go test ./...` is the build.
# (Nothing may import Go's plugin package: a binary that can load plugins is
# linked to bind every symbol at start, and go-nvml relies on lazy binding, so
# it would die with "undefined symbol: nvml..."; cmd/hyperpod-agent's
# TestPlainBuildStarts guards it.) Only the static builds (STATIC_BUILD) take tags.
BIN     := bin
PKGS    := ./...
BINARIES := hyperpodrun hyperpodrun-rdzv-host hyperpod-agent hyperpod-coordinator hyperpod-kube-controller elasticctl

.PHONY: architecture build deps generate test test-python test-short bench bench-scale soak soak-short demo demo-standalone image agent-image lint clean

build:
	@mkdir -p $(BIN)
	@for b in $(BINARIES); do \
		if ls cmd/$$b/*.go >/dev/null 2>&1; then $(GO) build -o $(BIN)/$$b ./cmd/$$b || exit 1; fi; \
	done
	@# The hyperpodrun the node agent mounts into containers: static, so it
	@# runs in any image (it never loads NVML there: the agent resolves
	@# --nproc-per-node gpu to a number).
	$(STATIC_BUILD) -o $(BIN)/hyperpodrun-static ./cmd/hyperpodrun 2>&1 | grep -v "dlopen\|cgo2.c\|^# " || true
	@test -x $(BIN)/hyperpodrun-static
	$(GO) build -o $(BIN)/worker ./examples/worker
	$(GO) build -o $(BIN)/demo ./examples/demo

## test: vet, then every test with the race detector (real etcd, real processes,
## real PyTorch DDP when python3-torch is installed).
# End-to-end packages that run real multi-process PyTorch training, and
# rendezvous, whose tests kill etcd leaders under live leases and measure
# how close a node came to fencing: one at a time, so they never starve
# each other's lease keepalives on a 2-core box.
E2E_PKGS := ./agent/elastic ./examples/demo ./cmd/hyperpodrun ./operator-shim/kubernetes ./rendezvous

## deps: what the tests need (as root: installed when missing; otherwise
## the exact command to run is printed).
deps:
	@bash scripts/check-deps.sh

test: deps test-python lint
	$(GO) test -race -timeout 25m $$($(GO) list $(PKGS) | grep -v -E '/agent/elastic$$|/examples/demo$$|/cmd/hyperpodrun$$|/operator-shim/kubernetes$$|/rendezvous$$')
	$(GO) test -race -timeout 25m -p 1 $(E2E_PKGS)
	@# The chaos soak's short version (issue 10): real etcd killed and
	@# restarted, coordinators, node agents and jobs under seeded faults.
	$(GO) run ./bench/soak -short -seed 1

## test-python: the stdlib Python helper's unittests (with Debian's torch for
## the gloo tests when present), in a TMPDIR of their own that must be empty
## afterwards: a test leaves no control or checkpoint directory behind.
PYTHON_TEST ?= $(shell if /usr/bin/python3 -c 'import torch' 2>/dev/null; then echo /usr/bin/python3; else echo python3; fi)
test-python:
	@t=$$(mktemp -d) || exit 1; (cd checkpoint/python && TMPDIR="$$t" $(PYTHON_TEST) -m unittest discover -s tests); rc=$$?; \
	left=$$(ls -A "$$t"); rm -rf "$$t"; \
	if [ -n "$$left" ]; then echo "test-python: the tests left these in their TMPDIR: $$left" >&2; exit 1; fi; exit $$rc

test-short:
	$(GO) test -short $(PKGS)

## bench: every performance figure as "BENCH <name> <value> <unit> [anchor=] [target=]".
bench: build
	@$(GO) run ./bench/launch -hyperpodrun $(BIN)/hyperpodrun
	@$(GO) run ./bench/ctl -elasticctl $(BIN)/elasticctl
	@# elasticctl's listing decoders (package jsonscan) against encoding/json
	@# on 10,000 jobs' records, taken in turn.
	@$(GO) test -run '^$$' -bench BenchmarkListingDecoders -benchtime=1x ./cmd/elasticctl/internal/query | grep -E '^BENCH'
	@# The containerd runtime (issue 12): start-to-first-step against the
	@# process runtime, and a 200 MB pull (skips where containerd cannot run).
	@$(GO) test -run '^$$' -bench BenchmarkContainerRuntime -benchtime=1x ./agent/node/jobrunner | grep -E '^BENCH|SKIP|skip' || true
	@# coordinator_daemon (issue 15): the coordinator binary on Debian's etcd
	@# at 500/2,000/5,000 nodes: submit->decision, idle cost, writes and
	@# agent watch events per churn round, DB growth, RSS.
	@for b in rdzvscale elastic engine kueue fairshare coordinator_daemon; do \
		if ls bench/$$b/*.go >/dev/null 2>&1; then $(GO) run ./bench/$$b || exit 1; fi; \
	done
	@# Kueue's baseline through the coordinator daemon and etcd, real time.
	@$(GO) run ./bench/kueue -daemon

## bench-scale: issue 27's scale figures (under 10 minutes on 2 cores): the
## rendezvous to "workers may start" (every node past the ready barrier and
## holding its running marker) at 1,000, 10,000 and 20,000 nodes, the
## coordinator daemon at 20,000 nodes / 50,000 jobs / 300 teams on Debian's
## etcd (fsync on) and the pure engine at 50,000 nodes / 100,000 jobs.
bench-scale: build
	@echo "# bench-scale: machine load $$(cut -d' ' -f1-3 /proc/loadavg), $$(nproc) cores"
	@# One process holds every node's lease here (10,000-20,000 keepalive
	@# streams' worth on 2 cores, a keepalive each TTL/6): a 10 s lease keeps
	@# the bench's own CPU starvation from reading as lost leases. A real
	@# node holds one lease. 20,000 leases of 10 s are 12,000 keepalives a
	@# second, past one etcd's budget on 2 cores (docs/scale.md): that size
	@# runs with a 30 s lease, as a job of that size would.
	@$(GO) run ./bench/rdzvscale -ready -n 1000,10000 -events-at 10000 -auth-at 0 -timeout 90s -lease-ttl 10s
	@$(GO) run ./bench/rdzvscale -ready -n 20000 -auth-at 0 -timeout 120s -lease-ttl 30s
	@$(GO) run ./bench/coordinator_daemon -coordinator $(BIN)/hyperpod-coordinator -sizes 20000x50000x300
	@$(GO) run ./bench/engine -nodes 50000 -jobs 100000 -teams 300 -cycles 7 -name engine_cycle_50000n_100000j -target 500

## soak: the chaos soak of issue 10 (real etcd, 2 coordinators, 3 node agents,
## a DDP job and a bundled-worker job; seeded faults; invariants checked all
## the time; BENCH lines; exit 1 when an invariant broke). SOAK_DURATION is
## how long faults are injected (default 20m), SOAK_SEED the schedule's seed,
## SOAK_ETCD_MEMBERS=3 a 3-member etcd with member faults (leader SIGKILL, a
## member down for minutes, a member's disk full, quorum lost for 30 s).
## soak-short: about 3 minutes of it (faults for 2m, shorter etcd outages).
soak:
	$(GO) run ./bench/soak $(SOAK_FLAGS)

soak-short:
	$(GO) run ./bench/soak -short $(SOAK_FLAGS)

## demo: the main demo on an embedded etcd (no setup): coordinator, 4 node
## agents, two teams, an elastic job shrunk and grown back by fair share.
demo: build
	@./$(BIN)/demo $(if $(filter 0,$(AUTH)),-auth=false)

## demo-standalone: hyperpodrun --standalone --nproc-per-node 4 on real DDP.
demo-standalone: build
	PYTHON_EXEC=$${PYTHON_EXEC:-/usr/bin/python3} ./$(BIN)/hyperpodrun --standalone --nproc-per-node 4 examples/pytorch/train_ddp.py --steps 40

## image: the ElasticJob controller's image, which is also the job pods'
## launcher image (docs/kubernetes.md): a static hyperpod-kube-controller and
## a static hyperpodrun in /usr/local/bin, run as 65532. IMAGE=registry/repo:tag
## pushes it (credentials from `docker login`); without IMAGE it is written to
## bin/hyperpod-kube-controller-image.tar (docker load -i / ctr images import).
## IMAGE_FLAGS passes more flags (-insecure: a plain-HTTP registry).
# STATIC_BUILD is a static, cgo-linked build; osusergo,netgo: os/user and net
# in pure Go, since glibc's NSS (getpwnam, getaddrinfo) needs shared libraries
# a static binary cannot load.
STATIC_BUILD = CGO_ENABLED=1 $(GO) build -tags osusergo,netgo -ldflags '-linkmode external -extldflags "-static"'
image:
	@mkdir -p $(BIN)
	@rm -f $(BIN)/hyperpodrun-static $(BIN)/hyperpod-kube-controller-static
	$(STATIC_BUILD) -o $(BIN)/hyperpodrun-static ./cmd/hyperpodrun 2>&1 | grep -v "dlopen\|cgo2.c\|^# " || true
	$(STATIC_BUILD) -o $(BIN)/hyperpod-kube-controller-static ./cmd/hyperpod-kube-controller 2>&1 | grep -v "dlopen\|cgo2.c\|^# " || true
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null) $(GO) run ./operator-shim/kubernetes/image \
		-controller $(BIN)/hyperpod-kube-controller-static -hyperpodrun $(BIN)/hyperpodrun-static \
		-version "$$(git describe --tags --always --dirty 2>/dev/null || echo dev)" -revision "$$(git rev-parse HEAD 2>/dev/null)" \
		$(if $(IMAGE),-push $(IMAGE),-o $(BIN)/hyperpod-kube-controller-image.tar) $(IMAGE_FLAGS)

## agent-image: the node agent's image, the one the hyperpod-agent DaemonSet
## names (examples/kubernetes/daemonset.yaml): a static hyperpod-agent (its
## entrypoint, run as root) and a static hyperpodrun (also as
## /usr/local/bin/hyperpodrun-static, which the containerd DaemonSet's init
## container copies). IMAGE=registry/repo:tag pushes it; without IMAGE it is
## written to bin/hyperpod-agent-image.tar. IMAGE_FLAGS as for image.
agent-image:
	@mkdir -p $(BIN)
	@rm -f $(BIN)/hyperpodrun-static $(BIN)/hyperpod-agent-static
	$(STATIC_BUILD) -o $(BIN)/hyperpodrun-static ./cmd/hyperpodrun 2>&1 | grep -v "dlopen\|cgo2.c\|^# " || true
	$(STATIC_BUILD) -o $(BIN)/hyperpod-agent-static ./cmd/hyperpod-agent 2>&1 | grep -v "dlopen\|cgo2.c\|^# " || true
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null) $(GO) run ./operator-shim/kubernetes/image \
		-agent $(BIN)/hyperpod-agent-static -hyperpodrun $(BIN)/hyperpodrun-static \
		-version "$$(git describe --tags --always --dirty 2>/dev/null || echo dev)" -revision "$$(git rev-parse HEAD 2>/dev/null)" \
		$(if $(IMAGE),-push $(IMAGE),-o $(BIN)/hyperpod-agent-image.tar) $(IMAGE_FLAGS)

## lint: tracked build outputs, gofmt, go vet and staticcheck (pinned, run
## through the Go module proxy: nothing to install).
STATICCHECK_VERSION := v0.8.2
lint:
	@bash scripts/check-tree.sh
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) $(PKGS)

## generate: the Kubernetes code generated from the hyperpodrun.io API types
## (operator-shim/kubernetes/apis/v1alpha1): controller-gen's deep copies and
## CRDs, client-gen's typed clientset (pinned, run through the Go module
## proxy: nothing to install), then the example manifests built from them.
## A test fails when a committed generated file is stale.
CONTROLLER_GEN := sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0
CLIENT_GEN := k8s.io/code-generator/cmd/client-gen@v0.37.2
generate:
	$(GO) run ./operator-shim/kubernetes/gen/codegen -controller-gen $(CONTROLLER_GEN) -client-gen $(CLIENT_GEN)
	$(GO) run ./operator-shim/kubernetes/gen

## architecture: rewrite ARCHITECTURE.md's package picture from go list
## (a test fails when it is stale or an import goes up a layer).
architecture:
	$(GO) run ./internal/archgraph/cmd

clean:
	rm -rf $(BIN)
