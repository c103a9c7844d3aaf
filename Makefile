# cube: the two commands a new user needs are `make run` and `make test`.
# Everything else is for developers; see README.md and docs/.

CARGO ?= cargo
DATA ?= ./cube-data
DURATION ?= 30s
CLIENTS ?= 16
WORKLOAD ?= seed
# Extra flags for cubed: make run ARGS="--key-file KEY"
ARGS ?=
STRESS_DIR := target/stress

.PHONY: build release run test test-tools test-python check fmt clippy lint codec-deep stress stress-short compare scale bench sim crash fuzz fuzz-setup clean-data

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --workspace --release

# Start the daemon in the foreground on the default data dir.
run: release
	@echo "cubed: data dir $(DATA), socket $(DATA)/cubed.sock (Ctrl-C stops it cleanly)"
	@echo "try:   ./target/release/cubec --socket $(DATA)/cubed.sock ping"
	./target/release/cubed --data $(DATA) $(ARGS)

# All tests. The integration tests start real cubed processes, so the
# binaries are built first.
test: test-tools
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace
	$(MAKE) test-python

# What the tests run besides cargo: promtool (Debian's prometheus package)
# checks the metrics exposition (client/tests/cli_metrics.rs).
test-tools:
	@command -v promtool >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "make test: installing promtool (apt-get install prometheus)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
				--no-install-recommends prometheus >/dev/null || exit 1; \
		else \
			echo "make test: promtool is missing: install Debian's prometheus package" \
				"(sudo apt-get install prometheus), then run make test again"; exit 1; \
		fi; }

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# What CI checks besides the tests: formatting and lints (the workspace
# denies `unsafe_code` and `unwrap_used`, every crate root `too_many_lines`
# outside tests; clippy runs with -D warnings).
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The full gate: formatting, lints, all tests (a 5-cycle crash torture
# among them), a longer crash torture, more simulation seeds, a short fuzz
# run of every target, and a short stress run.
check:
	$(MAKE) lint
	$(MAKE) test
	$(MAKE) codec-deep
	$(CARGO) test -p cube-server --test tenancy -- --ignored
	$(MAKE) test-python PYTEST_MARK=slow
	$(MAKE) crash CYCLES=20
	$(MAKE) sim SEEDS=100
	$(CARGO) test --manifest-path fuzz/Cargo.toml --no-default-features
	$(MAKE) fuzz FUZZ_SECONDS=20
	$(MAKE) stress-short

# The wire codec's properties with many more cases than `make test` runs:
# every decoder accepts exactly one encoding of each message. A failing
# case is saved by proptest under protocol/tests/proptest-regressions/:
# fix the decoder and commit that file, so every later run replays it.
CODEC_CASES ?= 4096
codec-deep:
	PROPTEST_CASES=$(CODEC_CASES) $(CARGO) test -p cube-protocol --test decode_never_panics

# Latency histograms from a fresh throwaway daemon (DURATION=150s for the
# predecessor's run length), of the seed workload unless WORKLOAD says
# otherwise. Table on the terminal; JSON and SVG plot in target/stress/.
stress: release
	@mkdir -p $(STRESS_DIR)
	./target/release/cube-stress --duration $(DURATION) --clients $(CLIENTS) --workload $(WORKLOAD) \
		--json $(STRESS_DIR)/latest.json --plot $(STRESS_DIR)/latest.svg

stress-short:
	$(MAKE) stress DURATION=15s

# cube next to Redis and SQLite: put and get at 1, 16 and 64 clients.
compare: release
	@mkdir -p $(STRESS_DIR)
	./target/release/cube-stress compare --json $(STRESS_DIR)/compare.json

# Issue 32's scale benchmark: a data set of SCALE_CELLS cells (64-byte
# values) built once in SCALE_DIR and reused by later runs (other cells
# rebuild it), then measured with the release cubed: import rate, restart
# time, hot and cold gets beside the pread floor, a 64 k-cell box, RSS
# beside Redis's (docs/benchmarks.md, "Scale"). SCALE_ARGS adds flags:
# SCALE_ARGS="--daemon-arg=--cache-bytes=2GiB --duration 30s".
SCALE_CELLS ?= 200000000
SCALE_DIR ?= target/scale
SCALE_ARGS ?=
scale:
	$(CARGO) build --release -p cube-server -p cube-stress
	@mkdir -p $(STRESS_DIR)
	./target/release/cube-stress scale --cells $(SCALE_CELLS) --dir $(SCALE_DIR) \
		--cubed ./target/release/cubed --json $(STRESS_DIR)/scale.json $(SCALE_ARGS)

bench:
	$(CARGO) bench --workspace

# Seeded storage-fault simulation (power loss, torn writes, EIO, ENOSPC,
# fsyncgate). `make test` runs a fixed set of seeds; this runs SEEDS of them.
# Replay one: CUBE_SIM_SEED=S cargo test -p cube-store --test storage_faults
SEEDS ?= 500
sim:
	CUBE_SIM_SEEDS=$(SEEDS) $(CARGO) test --release -p cube-store --test storage_faults -- --nocapture

# Crash torture: many clients (puts, deletes, edges, cell programs, checkpoints) against a
# cubed with tiny segments and thresholds, SIGKILLed at random moments and
# inside checkpoints and compactions, restarted and read back, CYCLES times.
# `make test` runs 5 cycles (stress/tests/crash_torture.rs).
CYCLES ?= 100
SEED ?= 1
crash: release
	./target/release/cube-stress crash --cycles $(CYCLES) --seed $(SEED)

# Fuzz every target for FUZZ_SECONDS each, with the first engine that is
# there: AFL++ through afl.rs (`cargo afl`, coverage-guided on the stable
# toolchain: fuzz/run-afl.sh), else libFuzzer (cargo-fuzz, nightly), else
# `make fuzz-setup` installs cargo-afl and AFL++ is used, else (no network)
# the stable driver (fuzz/src/bin/cube-fuzz-stable.rs, mutations without
# coverage feedback). AFL++ and libFuzzer start from fuzz/seeds/TARGET/ and
# the minimized corpus kept in the repository (fuzz/corpus/TARGET/), which
# AFL++ rewrites at the end of each target (afl-cmin): commit it. Crashes
# land in fuzz/artifacts/TARGET/ and fail the run. FUZZ_ENGINE=afl,
# libfuzzer or stable picks one. No sanitizer (-s none): the code is safe
# Rust but for the few modules listed in docs/ARCHITECTURE.md ("unsafe"),
# and AddressSanitizer made the WAL target 30x slower; program_run drives
# the programs' fast API path. docs/robustness.md, "Fuzzing".
FUZZ_SECONDS ?= 60
FUZZ_ENGINE ?= auto
FUZZ_TARGETS := protocol_frames wal_segment checkpoint_file run_file program_source program_run
fuzz:
	@engine=$(FUZZ_ENGINE); \
	if [ $$engine = auto ]; then \
		if $(CARGO) afl --version >/dev/null 2>&1; then engine=afl; \
		elif $(CARGO) +nightly fuzz --version >/dev/null 2>&1; then engine=libfuzzer; \
		elif $(MAKE) fuzz-setup; then engine=afl; \
		else echo "make fuzz: could not install cargo-afl (above); falling back to the stable driver"; engine=stable; fi; \
	fi; \
	case $$engine in \
	afl) \
		echo "make fuzz: AFL++ (cargo afl, coverage-guided), $(FUZZ_SECONDS) s per target"; \
		FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz/run-afl.sh $(FUZZ_TARGETS) ;; \
	libfuzzer) \
		echo "make fuzz: libFuzzer (cargo +nightly fuzz), $(FUZZ_SECONDS) s per target"; \
		for t in $(FUZZ_TARGETS); do \
			mkdir -p fuzz/corpus/$$t; \
			(cd fuzz && $(CARGO) +nightly fuzz run -s none $$t corpus/$$t seeds/$$t -- \
				-max_total_time=$(FUZZ_SECONDS) -timeout=20 -max_len=65536 \
				-dict=fuzz.dict -print_final_stats=1) || exit 1; \
		done ;; \
	stable) \
		echo "make fuzz: stable driver, no coverage feedback"; \
		FUZZ_SECONDS=$(FUZZ_SECONDS) $(CARGO) run --release --manifest-path fuzz/Cargo.toml \
			--no-default-features --bin cube-fuzz-stable -- $(FUZZ_TARGETS) ;; \
	*) echo "make fuzz: FUZZ_ENGINE is auto, afl, libfuzzer or stable, not $$engine"; exit 2 ;; \
	esac

# What the coverage-guided `make fuzz` needs, installed once per machine:
# cargo-afl from crates.io (a few minutes: it builds AFL++ too), and AFL++'s
# runtime for this toolchain, which a rustc update needs again, and clang to
# build Lua with coverage callbacks (fuzz/run-afl.sh). No LLVM
# plugins (CMPLOG): they need the LLVM rustc was built with, not Debian's.
fuzz-setup:
	@if ! $(CARGO) afl --version >/dev/null 2>&1; then \
		echo "make fuzz-setup: cargo install --locked cargo-afl"; \
		$(CARGO) install --locked cargo-afl || exit 1; \
	fi
	@out=$$($(CARGO) afl config --build 2>&1) || echo "$$out" | grep -q "already built" \
		|| { echo "$$out"; exit 1; }
	@command -v clang >/dev/null 2>&1 || { echo "make fuzz-setup: apt-get install clang (instruments Lua)"; \
		apt-get install -y -q clang >/dev/null 2>&1 || echo "make fuzz-setup: no clang; Lua stays uninstrumented"; }

# The Python client's tests (clients/python) against target/debug/cubed, in a
# venv under target/pyenv with pytest and NumPy from PyPI (made on first use;
# where venv lacks ensurepip, pip is put in it by the system's pip, else by
# get-pip.py). PYTEST_MARK=slow runs the long tests (the 256^3 round trip).
PYENV := target/pyenv
PYTEST_MARK ?= not slow
$(PYENV)/.installed: clients/python/pyproject.toml
	@python3 -m venv $(PYENV) 2>/dev/null || python3 -m venv --without-pip --clear $(PYENV)
	@$(PYENV)/bin/python -m pip --version >/dev/null 2>&1 || \
		python3 -m pip --python $(PYENV)/bin/python install -q pip 2>/dev/null || \
		{ python3 -c "import urllib.request as u; u.urlretrieve('https://bootstrap.pypa.io/get-pip.py', '$(PYENV)/get-pip.py')" && \
		$(PYENV)/bin/python $(PYENV)/get-pip.py -q; }
	$(PYENV)/bin/python -m pip install -q pytest numpy -e clients/python
	@touch $@
test-python: $(PYENV)/.installed
	$(CARGO) build -p cube-server --bins
	CUBED_BIN=$(CURDIR)/target/debug/cubed $(PYENV)/bin/python -m pytest -q -m "$(PYTEST_MARK)" clients/python

clean-data:
	rm -rf $(DATA)
