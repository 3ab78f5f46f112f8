#!/usr/bin/env bash
# Make sure the PostgreSQL server the tests use is installed, running and
# reachable without a password.
#
# - If TENURE_TEST_DATABASE_URL is set (and differs from the default), it is
#   only checked: this script never manages a server it did not pick itself.
# - Otherwise it manages the default local server,
#   postgres://postgres@127.0.0.1:5432/postgres, using Debian's packages and
#   cluster tools (pg_lsclusters, pg_createcluster, pg_ctlcluster): install,
#   create, start, enable TCP on localhost, trust auth on loopback, wait.
#
# Idempotent. Silent when there is nothing to do, one line per action taken,
# one sentence and a non-zero exit status when it cannot succeed. Actions need
# root (CI runs as root); a running server never gets restarted unless it does
# not listen on TCP at all.
set -euo pipefail

readonly DEFAULT_URL='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'
readonly HOST=127.0.0.1 PORT=5432
readonly WAIT_SECONDS=30
export PGCONNECT_TIMEOUT=5

say() { echo "ensure-postgres: $*"; }
die() { echo "ensure-postgres: $*" >&2; exit 1; }

LOG=$(mktemp)
trap 'rm -f "$LOG" "$LOG.hba"' EXIT

# Run "$@" with its output in $LOG; on failure show the log's tail and die.
quietly() {
	local what=$1; shift
	if ! "$@" >"$LOG" 2>&1; then
		tail -n 20 "$LOG" >&2
		die "$what failed (command: $*)."
	fi
}

need_root() {
	[[ $EUID -eq 0 ]] || die "PostgreSQL is not usable at $HOST:$PORT and fixing it ($1) needs root; re-run as root: sudo bash scripts/ensure-postgres.sh"
}

# try_connect URL: succeeds if 'select 1' works; otherwise LAST_ERR says why.
LAST_ERR=''
try_connect() {
	local out
	if out=$(psql -X -w "$1" -Atc 'select 1' 2>&1 </dev/null) && [[ $out == 1 ]]; then
		return 0
	fi
	LAST_ERR=$(printf '%s' "$out" | tr '\n\t' '  ' | sed 's/  */ /g; s/ $//')
	return 1
}

# Hide a password in a URL before printing it.
redact() { sed -E 's#(//[^:/@]*):[^@/]*@#\1:***@#' <<<"$1"; }

apt_install() {
	need_root "installing $*"
	quietly 'apt-get update' timeout 600 apt-get update
	quietly "apt-get install $*" env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 \
		timeout 1200 apt-get install -y --no-install-recommends "$@"
	say "installed $* with apt-get."
}

server_binaries_present() {
	compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null &&
		compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null
}

# ---------------------------------------------------------------------------
# A custom URL: check it, never manage it.
url=${TENURE_TEST_DATABASE_URL:-}
if [[ -n $url && $url != "$DEFAULT_URL" ]]; then
	command -v psql >/dev/null || apt_install postgresql-client
	if ! try_connect "$url"; then
		die "TENURE_TEST_DATABASE_URL ($(redact "$url")) is not reachable ($LAST_ERR); this script only manages the default local server ($DEFAULT_URL), so fix that server or unset the variable."
	fi
	server_binaries_present ||
		say "note: no initdb/pg_ctl under /usr/lib/postgresql/*/bin (apt-get install postgresql provides them)."
	exit 0
fi

# ---------------------------------------------------------------------------
# The default local server. Ignore libpq variables that could redirect the
# local-socket commands below to another server.
unset PGHOST PGHOSTADDR PGPORT PGUSER PGDATABASE PGSERVICE PGPASSWORD

# 1. Packages: client, Debian cluster tools, server binaries (initdb, pg_ctl).
if ! command -v psql >/dev/null || ! command -v pg_ctlcluster >/dev/null ||
	! command -v pg_lsclusters >/dev/null || ! server_binaries_present; then
	apt_install postgresql
fi

try_connect "$DEFAULT_URL" && exit 0

# How to run a command as the postgres OS user without sudo.
if command -v runuser >/dev/null; then
	as_postgres() { (cd / && runuser -u postgres -- "$@"); }
elif command -v su >/dev/null; then
	as_postgres() { (cd / && su postgres -s /bin/sh -c "$(printf '%q ' "$@")"); }
else
	die "neither runuser nor su (util-linux) is available to run commands as the postgres user."
fi
# psql as the postgres OS user over the local socket (peer/trust auth).
local_psql() { as_postgres psql -X -w -p "$PORT" -d template1 -Atc "$1" </dev/null; }

# 2. A cluster on port 5432 (pg_lsclusters -h: version name port status ...).
cluster_info() { pg_lsclusters -h 2>/dev/null | awk -v p="$PORT" '$3 == p { print $1, $2, $4; exit }'; }
info=$(cluster_info)
if [[ -z $info ]]; then
	need_root "creating a cluster"
	ver=$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -n 1)
	[[ -n $ver ]] || die "no PostgreSQL server version found under /usr/lib/postgresql."
	name=main
	[[ -e /etc/postgresql/$ver/main ]] && name=tenure # main exists on another port
	quietly "pg_createcluster $ver $name" env LC_ALL=C.UTF-8 \
		pg_createcluster --start -p "$PORT" "$ver" "$name"
	say "created and started cluster $ver/$name on port $PORT."
	info=$(cluster_info)
	[[ -n $info ]] || die "pg_createcluster ran but no cluster on port $PORT shows up in pg_lsclusters."
fi
read -r ver name status <<<"$info"

# 3. Running.
if [[ $status != online* ]]; then
	need_root "starting cluster $ver/$name"
	quietly "starting cluster $ver/$name" pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start
	say "started cluster $ver/$name."
fi

# Wait until the server accepts connections on its local socket (it may be
# starting up or recovering).
for ((i = 0; i < WAIT_SECONDS; i++)); do
	pg_isready -q -p "$PORT" && break
	sleep 1
done
try_connect "$DEFAULT_URL" && exit 0
need_root "configuring cluster $ver/$name"
listen=$(local_psql 'show listen_addresses' 2>/dev/null) ||
	die "cluster $ver/$name does not answer on its local socket, see /var/log/postgresql/postgresql-$ver-$name.log."

# 4. Listening on 127.0.0.1 (changing listen_addresses needs a restart, but a
#    server that does not listen on TCP has no TCP clients to lose).
loopback='(^|[ ,])(\*|0\.0\.0\.0|localhost|127\.0\.0\.1)($|[ ,])'
if ! [[ $listen =~ $loopback ]]; then
	quietly 'setting listen_addresses' local_psql "alter system set listen_addresses = 'localhost'"
	quietly "restarting cluster $ver/$name" pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" restart
	say "cluster $ver/$name did not listen on 127.0.0.1 (listen_addresses = '$listen'); set it to 'localhost' and restarted the cluster."
fi

# 5. Trust auth for loopback TCP, if a password is what stands in the way.
try_connect "$DEFAULT_URL" && exit 0
auth_failure='pg_hba.conf rejects|password authentication failed|no password supplied|no pg_hba.conf entry|authentication failed|Peer authentication|Ident authentication'
if [[ $LAST_ERR =~ $auth_failure ]]; then
	hba=$(local_psql 'show hba_file' 2>/dev/null) || hba=/etc/postgresql/$ver/$name/pg_hba.conf
	[[ -f $hba ]] || die "cannot find pg_hba.conf of cluster $ver/$name (tried $hba)."
	if grep -qxF 'host all all 127.0.0.1/32 trust' "$hba" && grep -qxF 'host all all ::1/128 trust' "$hba"; then
		say "trust lines already in $hba; reloading anyway."
	else
		{
			echo '# Added by tenure scripts/ensure-postgres.sh: passwordless loopback for tests.'
			echo 'host all all 127.0.0.1/32 trust'
			echo 'host all all ::1/128 trust'
			cat "$hba"
		} >"$LOG.hba"
		cat "$LOG.hba" >"$hba" # keeps the file's owner and mode
		rm -f "$LOG.hba"
		say "prepended loopback trust rules to $hba."
	fi
	quietly "reloading cluster $ver/$name" pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" reload
	say "reloaded cluster $ver/$name."
fi

# 6. Wait until 'select 1' works over TCP.
for ((i = 0; i < WAIT_SECONDS; i++)); do
	try_connect "$DEFAULT_URL" && exit 0
	sleep 1
done
die "PostgreSQL cluster $ver/$name still refuses $DEFAULT_URL after ${WAIT_SECONDS}s ($LAST_ERR)."
