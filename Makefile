# Run `make` (or `make help`) to list the targets.

GO ?= go
# Packages that also get a -race run as part of `make test`.
RACE_PKGS := ./partition/ ./sink/ ./consumer/
# Go files to gofmt-check: tracked plus new untracked ones (find(1) outside git),
# existing files only.
GO_FILES = $(shell { git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || \
	find . -name '*.go' -not -path './.git/*'; } | while read -r f; do [ -f "$$f" ] && echo "$$f"; done)

.DEFAULT_GOAL := help
.PHONY: help test race bench lint demo

help: ## list the targets
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z_-]+:.*## / { printf "  %-6s — %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

test: ## ensure Postgres, vet, gofmt check, all tests, then -race on partition/sink/consumer
	bash scripts/ensure-postgres.sh
	@$(MAKE) --no-print-directory lint
	$(GO) test -count=1 -timeout 20m ./...
	$(GO) test -race -count=1 -timeout 15m $(RACE_PKGS)

race: ## all tests with the race detector
	$(GO) test -race -count=1 -timeout 30m ./...

bench: ## benchmarks only (no tests), with allocations
	$(GO) test -run '^$$' -bench . -benchmem ./...

lint: ## go vet + gofmt check
	$(GO) vet ./...
	@unformatted="$$(gofmt -l $(GO_FILES) </dev/null)"; \
	if [ -n "$$unformatted" ]; then \
		echo "gofmt: these files are not gofmt-formatted (fix with: gofmt -w <file>):"; \
		echo "$$unformatted"; \
		exit 1; \
	fi

demo: ## run the demo (go run ./cmd/tenure demo)
	$(GO) run ./cmd/tenure demo
