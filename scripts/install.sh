#!/usr/bin/env bash
# Builds openarray and installs it like a daemon: the binary, the systemd
# unit, shell completions, manual pages, and /etc/openarray/openarray.toml
# (only if absent; an existing configuration is never touched). Running it
# again updates everything else in place.
#
#   scripts/install.sh                     # into /usr/local and /etc
#   DESTDIR=/tmp/stage scripts/install.sh  # staged (packaging, tests)
#   PREFIX=/usr scripts/install.sh         # binary in /usr/bin
#
# OPENARRAY_BIN=path installs that binary instead of building one.
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX="${PREFIX:-/usr/local}"
DESTDIR="${DESTDIR:-}"
SYSCONFDIR="${SYSCONFDIR:-/etc}"
UNITDIR="${UNITDIR:-/etc/systemd/system}"

if [ -n "${OPENARRAY_BIN:-}" ]; then
  bin="$OPENARRAY_BIN"
else
  cargo build --release --locked --bin openarray
  bin="${CARGO_TARGET_DIR:-target}/release/openarray"
fi
[ -x "$bin" ] || { echo "install.sh: no executable at $bin" >&2; exit 1; }

root="$DESTDIR"
bindir="$root$PREFIX/bin"
sharedir="$root$PREFIX/share"
confdir="$root$SYSCONFDIR/openarray"

install -d "$bindir" "$root$UNITDIR" "$sharedir/man/man1" \
  "$sharedir/bash-completion/completions" "$sharedir/zsh/site-functions" \
  "$sharedir/fish/vendor_completions.d"
install -m 0755 "$bin" "$bindir/openarray"

# The unit names the binary where PREFIX put it.
sed "s#/usr/local/bin/openarray#$PREFIX/bin/openarray#g" contrib/openarray.service \
  > "$root$UNITDIR/openarray.service.tmp"
chmod 0644 "$root$UNITDIR/openarray.service.tmp"
mv "$root$UNITDIR/openarray.service.tmp" "$root$UNITDIR/openarray.service"

"$bin" completions bash > "$sharedir/bash-completion/completions/openarray"
"$bin" completions zsh > "$sharedir/zsh/site-functions/_openarray"
"$bin" completions fish > "$sharedir/fish/vendor_completions.d/openarray.fish"
"$bin" man --dir "$sharedir/man/man1"

# The configuration is the administrator's: written once, never replaced.
config="$confdir/openarray.toml"
if [ ! -e "$config" ]; then
  install -d -m 0755 "$confdir"
  {
    echo "# openarray configuration, read by \`openarray serve\` (and the"
    echo "# openarray.service unit) when no --config is given. Check changes with"
    echo "# \`openarray check-config\`; a running daemon takes them with"
    echo "# \`openarray config apply $SYSCONFDIR/openarray/openarray.toml\`."
    echo "#"
    echo "# As installed it serves the built-in default below. A fuller example"
    echo "# follows, commented out: its file devices are sparse 16G and 8G images"
    echo "# under /var/lib/openarray."
    echo
    "$bin" default-config
    echo
    sed -e 's/^\(.\)/# \1/' -e 's/^$/#/' examples/openarray.toml
  } > "$config.tmp"
  chmod 0600 "$config.tmp"
  mv "$config.tmp" "$config"
  echo "installed $config"
else
  echo "kept $config"
fi

if [ -z "$DESTDIR" ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi
echo "installed openarray to $root$PREFIX (start it with: systemctl enable --now openarray)"
