# overage — run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
LOCAL_PG := postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
# Tests create and drop their own databases on the DATABASE_URL server; when
# it is unset, the local PostgreSQL if it answers, else testcontainers-go.
WITH_TEST_DB = if [ -z "$$DATABASE_URL" ] && pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then export DATABASE_URL='$(LOCAL_PG)'; fi;

.PHONY: help build run test lint bench bench-meters bench-expiry chaos fuzz fuzz-ci

help: ## list the targets
	@grep -hE '^[a-zA-Z/_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

BIN ?= ./bin/overage
# The commit goes in by -X as well: Go stamps vcs.revision only where .git
# is a directory, not in a git worktree.
COMMIT := $(shell git rev-parse HEAD 2>/dev/null)

build: ## build bin/overage (overage version prints its commit)
	$(GO) build -buildvcs=auto -ldflags "-X main.commit=$(COMMIT)" -o $(BIN) ./cmd/overage

# The development build: the production one plus `overage dev`, its demo,
# the Stripe emulator and testcontainers (build tag dev).
DEV_BIN ?= ./bin/overage-dev

run: ## build the development binary; migrate and run everything on its embedded default, with a demo burst
	$(GO) build -tags dev -buildvcs=auto -ldflags "-X main.commit=$(COMMIT)" -o $(DEV_BIN) ./cmd/overage
	$(DEV_BIN) dev $(ARGS)

# -tags dev: the tests cover `overage dev` too. Each test's database is
# dropped when it ends; one migrated database, ovgtmpl_<hash>, is kept to be
# cloned next time (an ordinary database: `dropdb ovgtmpl_...` removes it,
# and a run drops those of other migration sets once a day old).
test: ## every test, against a real PostgreSQL (DATABASE_URL), with the race detector
	@$(WITH_TEST_DB) set -x; $(GO) test -tags dev -race -count=1 -timeout 30m ./...

chaos: ## the fault tests at full size: 2,000 events with workers SIGKILLed and a faulty Stripe; a 15 s database outage
	@$(WITH_TEST_DB) CHAOS_EVENTS=$${CHAOS_EVENTS:-2000} OUTAGE_SECONDS=$${OUTAGE_SECONDS:-15} $(GO) test -race -count=1 -timeout 30m -run '^(TestChaos|TestDatabaseOutageUnderLoad)$$' -v ./cmd/overage

# Each fuzz target with its package; `make test` runs their corpora
# (testdata/fuzz/...) as ordinary tests. Every target has a committed
# corpus: add what a run finds worth keeping there.
FUZZ_TARGETS := ./internal/fastjson:FuzzCanonicalJSON ./internal/fastjson:FuzzRenderString \
	./ingest:FuzzFingerprintIsSameRequest ./ingest:FuzzParseEvent ./ingest:FuzzFastParse \
	./ingest:FuzzIdempotencyKey ./ingest:FuzzCreateUsageEvent ./webhooks:FuzzWebhookPayload
FUZZTIME ?= 1m
# CI runs each target for FUZZ_CI_TIME: eight targets, about 2 minutes
# with the builds on 2 cores.
FUZZ_CI_TIME ?= 5s

# Go's fuzzing coordinator can fail a run whose -fuzztime expires while a
# worker is mid-call ("context deadline exceeded", golang/go#75804): no
# input is found or written then. Such a run is tried once more; a run that
# wrote a failing input, or fails any other way, fails the target.
fuzz: ## run each fuzz target for FUZZTIME (1m); a finding is written to the package's testdata/fuzz
	@$(WITH_TEST_DB) set -eo pipefail; out=$$(mktemp); trap 'rm -f "$$out"' EXIT; \
	for t in $(FUZZ_TARGETS); do \
		for try in 1 2; do \
			echo "fuzz $${t#*:} ($${t%%:*}) for $(FUZZTIME)"; \
			if $(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) -parallel $${FUZZ_PARALLEL:-2} "$${t%%:*}" 2>&1 | tee "$$out"; then break; fi; \
			if [ $$try = 1 ] && grep -q 'context deadline exceeded' "$$out" && ! grep -q 'Failing input written' "$$out"; then \
				echo "fuzz $${t#*:}: the -fuzztime shutdown race, no input found; once more"; continue; fi; \
			exit 1; \
		done; \
	done

fuzz-ci: ## run each fuzz target for FUZZ_CI_TIME (5s), as CI does after `make test`
	@$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZ_CI_TIME)

lint: ## go vet (both builds) and a gofmt check
	$(GO) vet ./...
	$(GO) vet -tags dev ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

bench: build ## ingest (HTTP vs pgbench), end to end, drain, status, then soak, volume and storage, and a month's storage packed (SOAK_SECONDS=0 skips those)
	@$(WITH_TEST_DB) ./bench/ingest.sh
	@$(WITH_TEST_DB) if [ "$${SOAK_SECONDS:-600}" != 0 ]; then ./bench/soak.sh && ./bench/pack.sh; fi

bench-meters: build ## every event on three per-model meters vs the two defaults, same events, A B B A: ingest, end to end, drain, with the ratios
	@$(WITH_TEST_DB) ./bench/meters.sh

bench-expiry: ## expiry keeps up: 10,000 events/s end to end for EXPIRY_SECONDS (600), time compressed (minute partitions); backlog and maintenance share, PASS/FAIL
	@$(WITH_TEST_DB) ./bench/expiry.sh
