#!/usr/bin/env bash
# Ensures the Debian packages deltafin builds against are installed.
# As root: installs the missing ones with apt-get. Otherwise: prints the exact
# apt-get line and exits 1.
set -u
PKGS="build-essential cmake pkg-config libcjson-dev libxxhash-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev liburing-dev libssl-dev libcurl4-openssl-dev"
# one dpkg-query for all of them (this runs before every `make`, `make run` included: keep it fast)
installed=$(dpkg-query -W -f='${Package} ${Status}\n' $PKGS 2>/dev/null | awk '$NF == "installed" && $(NF-1) == "ok" { sub(/:.*/, "", $1); print $1 }')
missing=""
for p in $PKGS; do
  case " $(echo $installed) " in *" $p "*) ;; *) missing="$missing $p" ;; esac
done
# --test: what the tests need besides the build (python3 for golden checks, node + npm for the pinned
# tokenizer packages and the openai client, nginx for the setup test's mirror). Commands found on PATH count, wherever they came from.
if [ "${1:-}" = "--test" ]; then
  command -v python3 >/dev/null || missing="$missing python3"
  command -v node >/dev/null || missing="$missing nodejs"
  command -v npm >/dev/null || missing="$missing npm"
  command -v curl >/dev/null || missing="$missing curl"
  command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing="$missing nginx-light"   # e2e_setup's loopback mirror
fi
[ -z "$missing" ] && exit 0
echo "deltafin: missing Debian packages:$missing" >&2
if [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 || { echo "deltafin: apt-get update failed" >&2; exit 1; }
  apt-get install -y -qq --no-install-recommends $missing >&2 || { echo "deltafin: apt-get install failed" >&2; exit 1; }
else
  echo "deltafin: run this, then build again:" >&2
  echo "  sudo apt-get install -y$missing" >&2
  exit 1
fi
