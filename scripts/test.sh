#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and property tests of every
# crate, and the integration tests that drive the real binary with real
# iSCSI clients (libiscsi's conformance suite, qemu-img, a bad-input flood).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

cargo fmt --all -- --check
# The benchmark report's own tests (no benchmark runs).
PYTHONDONTWRITEBYTECODE=1 python3 -m unittest bench/test_matrix_report.py
cargo clippy --workspace --all-targets --release --locked -- -D warnings
# The fuzz targets are a workspace of their own (run with a nightly
# toolchain, fuzz/README.md); they must still build and lint here.
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
cargo clippy --manifest-path fuzz/Cargo.toml --release --locked --target-dir target/fuzz -- -D warnings
# Release build: the integration tests push real I/O through the daemon.
cargo test --workspace --release --locked "$@"
