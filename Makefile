# hagroup — build, test, benchmark and demo.
# `make demo` and `make test` are the README's quick start; both install
# what is missing first (scripts/deps.sh).

GO        ?= go
export PATH := $(PATH):/usr/local/go/bin
BIN       := bin
PKGS      := ./...
COUNT     ?= 6
BENCHTIME ?= 1s
# A count, not a duration: with a duration, Go 1.26's fuzzing coordinator
# can fail a clean run with "context deadline exceeded" as the time runs
# out (golang/go#75804, fixed in Go 1.27; seen here in a clean-clone
# .ci/run). 100,000 inputs take ~10 s per target on the 2-vCPU machine.
FUZZTIME  ?= 100000x
DURATION  ?= 10m
# Fuzz targets as package:Target; `make test` runs each for a short time.
FUZZ_TARGETS := $(shell grep -rl --include='*_test.go' '^func Fuzz' pkg cmd 2>/dev/null | \
	xargs -r grep -H -o '^func Fuzz[A-Za-z0-9_]*' | sed -E 's|/[^/]*_test.go:func |:|')

.PHONY: all deps build test vet fmt-check fuzz fuzz-short bench demo soak man clean

all: build

deps:
	@./scripts/deps.sh

build: deps
	@mkdir -p $(BIN)
	@for c in hactl haagent hsmserve hademo haload; do \
		if [ -d cmd/$$c ]; then $(GO) build -trimpath -o $(BIN)/$$c ./cmd/$$c || exit 1; fi; \
	done
	@if [ -d cmd/hapkcs11 ]; then $(MAKE) --no-print-directory $(BIN)/libhapkcs11.so; fi

$(BIN)/libhapkcs11.so: $(shell find cmd/hapkcs11 pkg -type f 2>/dev/null) go.mod go.sum
	@mkdir -p $(BIN)
	$(GO) build -trimpath -buildmode=c-shared -ldflags='-s -w' -o $@ ./cmd/hapkcs11
	@rm -f $(BIN)/libhapkcs11.h

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# The whole suite, with the race detector, then each fuzz target briefly.
# It includes the chaos soak's short run (test/soak's defaults: 10 s of
# faults, ~20 s in all); `make soak DURATION=10m` is the long one.
test: deps fmt-check vet
	$(GO) test -race -timeout 20m $(PKGS)
	@$(MAKE) --no-print-directory fuzz-short

fuzz-short:
	@for t in $(FUZZ_TARGETS); do \
		pkg=./$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$pkg $$name ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

fuzz:
	@$(MAKE) --no-print-directory fuzz-short FUZZTIME=5m

# Every benchmark of the product, -count $(COUNT), summarised with benchstat;
# the 1,000-key catch-up once (it takes about a minute per run); the C
# module harness; the scaling picture of docs/BENCHMARKS.md.
bench: deps build
	@mkdir -p bench-out
	@uptime | tee bench-out/load.txt
	$(GO) test -run '^$$' -bench . -skip 'CatchUp1000Keys' -benchmem -benchtime $(BENCHTIME) -count $(COUNT) $(PKGS) | tee bench-out/go.txt
	$(GO) test -run '^$$' -bench 'CatchUp1000Keys' -benchtime 1x -count 1 ./pkg/recover | tee bench-out/catchup.txt
	$(GO) run golang.org/x/perf/cmd/benchstat@latest bench-out/go.txt | tee bench-out/benchstat.txt
	@if [ -x test/module/bench.sh ]; then test/module/bench.sh | tee bench-out/module.txt; fi
	$(GO) run ./test/load/benchreport -in bench-out/go.txt -svg docs/scaling.svg | tee bench-out/scaling.txt
	@uptime | tee -a bench-out/load.txt

demo: build
	@if [ -x $(BIN)/hademo ]; then $(BIN)/hademo; else ./scripts/demo.sh; fi

soak: build
	$(GO) test -race -run TestSoak -timeout 0 ./test/soak -soak.duration $(DURATION) -v

man:
	$(GO) run ./cmd/hactl man man

clean:
	rm -rf $(BIN) bench-out demo-out
