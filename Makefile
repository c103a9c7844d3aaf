# cube: the two commands a new user needs are `make run` and `make test`.
# Everything else is for developers; see README.md and docs/.

CARGO ?= cargo
DATA ?= ./cube-data
DURATION ?= 30
CLIENTS ?= 16
STRESS_DIR := target/stress

.PHONY: build release run test check fmt clippy stress stress-short compare bench sim clean-data

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --workspace --release

# Start the daemon in the foreground on the default data dir.
run: release
	@echo "cubed: data dir $(DATA), socket $(DATA)/cubed.sock (Ctrl-C stops it cleanly)"
	@echo "try:   ./target/release/cubec --socket $(DATA)/cubed.sock ping"
	./target/release/cubed --data $(DATA)

# All tests. The integration tests start real cubed processes, so the
# binaries are built first.
test:
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The full gate: formatting, lints, all tests, and a short stress run.
check:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(MAKE) test
	$(MAKE) stress-short

# Latency histograms from a fresh throwaway daemon (DURATION=150 for the
# predecessor's run length). Table on the terminal; JSON and SVG plot in
# target/stress/.
stress: release
	@mkdir -p $(STRESS_DIR)
	./target/release/cube-stress --duration $(DURATION) --clients $(CLIENTS) \
		--json $(STRESS_DIR)/latest.json --plot $(STRESS_DIR)/latest.svg

stress-short:
	$(MAKE) stress DURATION=15

# cube next to Redis and SQLite: put and get at 1, 16 and 64 clients.
compare: release
	@mkdir -p $(STRESS_DIR)
	./target/release/cube-stress compare --json $(STRESS_DIR)/compare.json

bench:
	$(CARGO) bench --workspace

# Seeded storage-fault simulation (power loss, torn writes, EIO, ENOSPC,
# fsyncgate). `make test` runs a fixed set of seeds; this runs SEEDS of them.
# Replay one: CUBE_SIM_SEED=S cargo test -p cube-store --test storage_faults
SEEDS ?= 500
sim:
	CUBE_SIM_SEEDS=$(SEEDS) $(CARGO) test --release -p cube-store --test storage_faults -- --nocapture

clean-data:
	rm -rf $(DATA)
