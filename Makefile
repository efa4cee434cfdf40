# overage — run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
export DATABASE_URL

.PHONY: help build run test lint bench chaos

help: ## list the targets
	@grep -hE '^[a-zA-Z/_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build bin/overage
	$(GO) build -o bin/overage ./cmd/overage

run: build ## migrate and run the pipeline on its embedded default
	./bin/overage migrate
	./bin/overage serve

test: ## every test, against a real PostgreSQL (DATABASE_URL), with the race detector
	$(GO) test -race -count=1 -timeout 20m ./...

lint: ## go vet and a gofmt check
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

bench: build ## ingest benchmark: HTTP vs the same transaction through pgbench
	./bench/ingest.sh
