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
# Hosts in `make soak`: 2 (the default) adds a second state dir, agent and
# load on the same members, as a fleet runs them; HOSTS=3 for three,
# HOSTS=1 for one host. SEED replays a fault schedule (0: from the clock).
HOSTS     ?= 2
SEED      ?= 0
# The version every binary reports (internal/version), from git describe.
VERSION   ?= $(shell packaging/version.sh)
LDFLAGS   := -X github.com/hagroup/hagroup/internal/version.stamped=$(VERSION)

# Where `make install` puts things. /usr/local by default, as a Debian
# admin expects of software not from a package; the .deb uses /usr.
# DESTDIR stages the tree elsewhere (packagers, `make deb`).
PREFIX      ?= /usr/local
DESTDIR     ?=
MULTIARCH   ?= $(shell gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
BINDIR      ?= $(PREFIX)/bin
PKCS11DIR   ?= $(PREFIX)/lib/$(MULTIARCH)/pkcs11
MANDIR      ?= $(PREFIX)/share/man
DOCDIR      ?= $(PREFIX)/share/doc/hagroup
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR  ?= $(PREFIX)/share/zsh/$(if $(filter /usr,$(PREFIX)),vendor-completions,site-functions)
FISHCOMPDIR ?= $(PREFIX)/share/fish/vendor_completions.d
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
SYSCONFDIR  ?= /etc
INSTALL_CONFIG ?= yes
INSTALL_VARS = BIN=$(BIN) PREFIX=$(PREFIX) DESTDIR=$(DESTDIR) BINDIR=$(BINDIR) PKCS11DIR=$(PKCS11DIR) \
	MANDIR=$(MANDIR) DOCDIR=$(DOCDIR) BASHCOMPDIR=$(BASHCOMPDIR) ZSHCOMPDIR=$(ZSHCOMPDIR) \
	FISHCOMPDIR=$(FISHCOMPDIR) UNITDIR=$(UNITDIR) SYSUSERSDIR=$(SYSUSERSDIR) SYSCONFDIR=$(SYSCONFDIR) \
	INSTALL_CONFIG=$(INSTALL_CONFIG)

# The .deb: nfpm, pinned, run through the Go module proxy.
NFPM      := $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.48.0
DIST      ?= dist
DEBROOT   := dist/deb-root

# Fuzz targets as package:Target; `make test` runs each for a short time.
FUZZ_TARGETS := $(shell grep -rl --include='*_test.go' '^func Fuzz' pkg cmd 2>/dev/null | \
	xargs -r grep -H -o '^func Fuzz[A-Za-z0-9_]*' | sed -E 's|/[^/]*_test.go:func |:|')

.PHONY: all deps build build-product test vet fmt-check fuzz fuzz-short bench demo soak man clean install uninstall deb

all: build

deps:
	@./scripts/deps.sh

build: deps
	@$(MAKE) --no-print-directory build-product CMDS="hactl haagent hsmserve hademo haload"

# What is installed and packaged: the three commands, the module and its
# helper.
build-product: CMDS ?= hactl haagent hsmserve
build-product:
	@mkdir -p $(BIN)
	@for c in $(CMDS); do \
		if [ -d cmd/$$c ]; then $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/$$c ./cmd/$$c || exit 1; fi; \
	done
	@$(MAKE) --no-print-directory $(BIN)/libhapkcs11.so $(BIN)/hapkcs11-helper

$(BIN)/libhapkcs11.so: $(shell find cmd/hapkcs11 pkg -type f 2>/dev/null) go.mod go.sum
	@mkdir -p $(BIN)
	$(GO) build -trimpath -buildmode=c-shared -ldflags='-s -w $(LDFLAGS)' -o $@ ./cmd/hapkcs11
	@rm -f $(BIN)/libhapkcs11.h

# The process libhapkcs11.so starts to serve a forked child (rpc.c); it
# lives beside the module.
$(BIN)/hapkcs11-helper: cmd/hapkcs11/helper/hapkcs11-helper.c
	@mkdir -p $(BIN)
	$(CC) -O2 -Wall -Werror -o $@ $< -ldl

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# The whole suite, with the race detector, then each fuzz target briefly.
# It includes the chaos soak's short run (test/soak's defaults: 10 s of
# faults, ~20 s in all, its history checked) and the history checker's
# planted violations (test/soak/history); `make soak DURATION=10m` is the
# long one.
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
# module harness; what a C_Initialize costs (TestInitCost); the scaling
# picture of docs/BENCHMARKS.md; forked children through the helper and
# nginx (TestForkBench, TestNginxBench).
bench: deps build
	@mkdir -p bench-out
	@uptime | tee bench-out/load.txt
	$(GO) test -run '^$$' -bench . -skip 'CatchUpKeys' -benchmem -benchtime $(BENCHTIME) -count $(COUNT) $(PKGS) | tee bench-out/go.txt
	$(GO) test -run '^$$' -bench 'CatchUpKeys' -benchtime 1x -count 1 ./pkg/recover | tee bench-out/catchup.txt
	$(GO) run golang.org/x/perf/cmd/benchstat@latest bench-out/go.txt | tee bench-out/benchstat.txt
	@if [ -x test/module/bench.sh ]; then test/module/bench.sh | tee bench-out/module.txt; fi
	$(GO) test -count=1 -v -run '^TestInitCost$$' ./test/module -initcost=30 | grep -E '^initcost|^(ok|FAIL)' | tee bench-out/initcost.txt
	$(GO) test -count=1 -v -run '^Test(ForkBench|NginxBench)$$' ./test/module -forkbench=5 | grep -E '^(forkbench|nginxbench)|^(ok|FAIL)' | tee bench-out/fork.txt
	$(GO) test -count=1 -v -run '^TestForkMix$$' ./test/module -forkbench=20 | grep -E '^forkmix|^(ok|FAIL)' | tee bench-out/forkmix.txt
	$(GO) run ./test/load/benchreport -in bench-out/go.txt -svg docs/scaling.svg | tee bench-out/scaling.txt
	@uptime | tee -a bench-out/load.txt

demo: build
	@if [ -x $(BIN)/hademo ]; then $(BIN)/hademo; else ./scripts/demo.sh; fi

soak: build
	$(GO) test -race -run TestSoak -timeout 0 ./test/soak -soak.duration $(DURATION) -soak.hosts $(HOSTS) -soak.seed $(SEED) -v

man:
	$(GO) run ./cmd/hactl man man

# See packaging/install.sh for what goes where; `make uninstall` removes
# what its MANIFEST lists and leaves $(SYSCONFDIR)/hagroup alone.
install: build-product
	@$(INSTALL_VARS) packaging/install.sh install

uninstall:
	@$(INSTALL_VARS) packaging/install.sh uninstall

# $(DIST)/hagroup_<version>_<arch>.deb, from a staged `make install`.
deb: build-product
	@rm -rf $(DEBROOT) && mkdir -p $(DEBROOT) $(DIST)
	@$(MAKE) --no-print-directory install PREFIX=/usr DESTDIR=$(abspath $(DEBROOT)) INSTALL_CONFIG=no >/dev/null
	DEB_VERSION=$$(packaging/version.sh deb) DEB_ARCH=$$($(GO) env GOARCH) \
		$(NFPM) package --config packaging/nfpm.yaml --packager deb --target $(DIST)/

clean:
	rm -rf $(BIN) bench-out demo-out $(DIST)
