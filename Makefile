# Run `make` (or `make help`) to list the targets.

GO ?= go
# Packages that also get a -race run as part of `make test`.
RACE_PKGS := ./partition/ ./sink/ ./consumer/
# Go files to gofmt-check: tracked plus new untracked ones (find(1) outside git),
# existing files only.
GO_FILES = $(shell { git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || \
	find . -name '*.go' -not -path './.git/*'; } | while read -r f; do [ -f "$$f" ] && echo "$$f"; done)

.DEFAULT_GOAL := help
.PHONY: help test race bench microbench lint demo chaos-soak chaos-failover model

help: ## list the targets
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z_-]+:.*## / { printf "  %-11s — %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

test: ## the README's test command: set-up (Postgres, gcc), vet, gofmt, all tests, -race on the core
	bash scripts/test.sh

race: ## all tests with the race detector
	$(GO) test -race -count=1 -timeout 30m ./...

bench: ## tenure bench: tenure beside an at-least-once program, a naive one and the COPY ceiling (docs/throughput.md)
	$(GO) run ./cmd/tenure bench

microbench: ## the go test benchmarks only (no tests), with allocations
	$(GO) test -run '^$$' -bench . -benchmem ./...

lint: ## go vet + gofmt check
	$(GO) vet ./...
	@unformatted="$$(gofmt -l $(GO_FILES) </dev/null)"; \
	if [ -n "$$unformatted" ]; then \
		echo "gofmt: these files are not gofmt-formatted (fix with: gofmt -w <file>):"; \
		echo "$$unformatted"; \
		exit 1; \
	fi

demo: ## the README's run command: ensure Postgres, then go run ./cmd/tenure demo
	bash scripts/ensure-postgres.sh
	$(GO) run ./cmd/tenure demo

# The formation-backed chaos run's length: make chaos-failover FAILOVER_DURATION=30m
FAILOVER_DURATION ?= 10m

chaos-failover: ## a chaos run on a pg_auto_failover formation, its primary killed over and over (pg-failover), FAILOVER_DURATION (10m) of faults
	$(GO) test -count=1 -timeout 0 -v -run TestChaos ./integration/chaos -chaos.postgres formation -chaos.duration $(FAILOVER_DURATION)

model: ## model-check the ownership protocol and strict hand-off with spin (docs/model/*.pml)
	bash scripts/model-check.sh
	bash scripts/model-check-strict.sh

# The soak's length and group protocol: make chaos-soak CHAOS_DURATION=2h CHAOS_PROTOCOL=consumer
# (the seed comes from the clock and is printed; TENURE_CHAOS_SEED=N replays one).
CHAOS_DURATION ?= 30m
CHAOS_PROTOCOL ?= classic

chaos-soak: ## a long chaos run: CHAOS_DURATION (30m) of faults, CHAOS_PROTOCOL classic or consumer (CI runs five short ones)
	$(GO) test -count=1 -timeout 0 -v -run TestChaos ./integration/chaos -chaos.soak \
		-chaos.duration $(CHAOS_DURATION) -chaos.protocol $(CHAOS_PROTOCOL)
