#!/usr/bin/env bash
# The test command (README, `make test`, CI): sets up what the tests need on
# a fresh Debian machine, then runs every check.
#
#   1. tools: a C compiler for -race, spin for the model check, kcat
#      (librdkafka's client, for the interoperability test), ip and nft for
#      the network faults, prometheus/promtool for the alerting rules, and
#      pgbouncer for the pooler tests
#      (installed with apt-get if missing, as root)
#   2. PostgreSQL at TENURE_TEST_DATABASE_URL or the local default (scripts/ensure-postgres.sh),
#      and pg_auto_failover for the failover tests (apt-get, as root, if missing)
#   3. go vet and a gofmt check
#   4. the model checks of the ownership protocol and of strict hand-off
#      (scripts/model-check.sh, scripts/model-check-strict.sh)
#   5. SeaweedFS's `weed` for the S3 export test: built once per machine
#      (scripts/build-weed.sh, 10-15 minutes the first time, cached in
#      ~/.cache/tenure) and passed to the tests as TENURE_TEST_WEED
#   6. all tests (integration included), six short chaos runs (classic,
#      KIP-848 consumer protocol, commits spanning partitions, on a pg_auto_failover formation, strict
#      hand-off, and the newest fault kinds alone; seeds from the clock), then
#      -race on the core packages
#
# Kafka needs nothing: tests start franz-go's kfake on loopback ports, or use
# the cluster named by TENURE_TEST_BROKERS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

command -v go >/dev/null || export PATH="$PATH:/usr/local/go/bin"
go version

# apt_install WHAT PRONOUN PACKAGE...: installs the packages with apt-get
# when run as root; otherwise says they are needed (WHAT: what for, in the
# message) and exits.
apt_install() {
	local what=$1 pronoun=$2
	shift 2
	if [[ $EUID -ne 0 ]]; then
		echo "test: needs $* ($what); install $pronoun with apt-get or run as root" >&2
		exit 1
	fi
	echo "test: installing $*"
	timeout 600 apt-get update -qq
	DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

missing=()
command -v gcc >/dev/null || missing+=(gcc libc6-dev)
command -v spin >/dev/null || missing+=(spin)
command -v kcat >/dev/null || missing+=(kcat)
# Network faults (internal/testinfra/netfault: workers in network namespaces of their
# own, packets dropped by nftables) need ip and nft, and root.
command -v ip >/dev/null || missing+=(iproute2)
command -v nft >/dev/null || [[ -x /usr/sbin/nft ]] || missing+=(nftables)
# Prometheus and promtool: the alerting rules' tests (promtool check/test
# rules) and a real server evaluating one rule to firing.
{ command -v prometheus >/dev/null && command -v promtool >/dev/null; } || missing+=(prometheus)
# Headless Chromium (and a font for its screenshots): the ownership page's
# browser test.
command -v chromium >/dev/null || missing+=(chromium fonts-dejavu-core)
# PgBouncer (Debian installs it in /usr/sbin): the transaction pooling
# tests start their own in front of a throwaway PostgreSQL.
command -v pgbouncer >/dev/null || [[ -x /usr/sbin/pgbouncer ]] || missing+=(pgbouncer)
if ((${#missing[@]})); then
	apt_install "gcc for go test -race and the model check, spin for the model check, kcat for the interoperability test, iproute2 and nftables for the network faults, prometheus for the alerting rules, chromium for the ownership page's browser test, pgbouncer for the pooler tests" \
		them "${missing[@]}"
fi

bash scripts/ensure-postgres.sh

# pg_auto_failover for the failover tests (internal/testinfra/pgha, integration's
# TestFailover*): Debian's postgresql-N-auto-failover for the newest
# PostgreSQL server installed, N derived from /usr/lib/postgresql/N.
pg_major=$(ls -d /usr/lib/postgresql/*/bin/postgres 2>/dev/null | sed -E 's#^/usr/lib/postgresql/([0-9]+)/.*#\1#' | sort -n | tail -n 1 || true)
if [[ -z $pg_major ]]; then
	echo "test: no PostgreSQL server under /usr/lib/postgresql after ensure-postgres.sh" >&2
	exit 1
fi
if ! command -v pg_autoctl >/dev/null || [[ ! -e /usr/lib/postgresql/$pg_major/lib/pgautofailover.so ]]; then
	apt_install "pg_auto_failover, for the failover tests" it "postgresql-$pg_major-auto-failover"
fi
# Installed: the failover tests must run, not skip.
export TENURE_TEST_REQUIRE_PGHA=1
# kcat (librdkafka) was installed above: its interoperability test must run.
export TENURE_TEST_REQUIRE_KCAT=1
# PgBouncer was installed above: its tests must run.
export TENURE_TEST_REQUIRE_PGBOUNCER=1

echo "== go vet"
go vet ./...
echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*'))
if [[ -n $unformatted ]]; then
	echo "gofmt: these files are not formatted (gofmt -w FILE):" >&2
	echo "$unformatted" >&2
	exit 1
fi

echo "== model check"
bash scripts/model-check.sh
echo "== model check of strict hand-off"
bash scripts/model-check-strict.sh

echo "== SeaweedFS for the S3 export test"
if weed=$(bash scripts/build-weed.sh); then
	export TENURE_TEST_WEED=$weed
	echo "using $weed"
else
	echo "test: could not build SeaweedFS (scripts/build-weed.sh); the S3 export test will fail (TENURE_TEST_S3_SKIP=1 skips it)" >&2
fi

echo "== go test (every package; the chaos package's own unit tests only: its runs follow)"
go test -count=1 -timeout 25m $(go list ./... | grep -v /integration/chaos)
go test -count=1 -short ./integration/chaos
# Six short chaos runs, each with a seed from the clock, so that every CI
# run tries another fault schedule: one per group protocol (classic, and
# KIP-848's consumer protocol), both with the workers' default
# --commit-span 64 (commits that span partitions; over two partitions a
# worker shares a transaction only when more batches wait than it runs
# transactions at once, so the KIP-848 run runs one at a time,
# --commit-transactions 1, and its batches share), one whose workers
# commit each batch in a transaction of its own (--commit-span 1,
# KIP-848), one on a pg_auto_failover formation (installed above) whose primary is killed and its synchronous standby
# promoted among the other faults (pg-failover; about 1m40s for 60s of
# faults, two failovers), one with --strict workers, checked for
# G3-strict (classic: kfake's KIP-848 offset commit rule cannot carry it),
# and one that deals only the newest kinds (-chaos.kinds: offsets-reset,
# add-partitions, rolling-restart, partition-multi-host), with --strict
# workers so that its rolling restarts mix strict and plain ones: a 60s
# run of every kind draws each of them only now and then, this one draws
# them all (70s to 2 minutes here; each of those faults waits, quietly,
# for what it broke to move again, at most B = 48s of quiet time). Every run also checks liveness
# (no partition with jobs waiting stalls for longer than B of quiet time,
# no worker stays out of the group: integration/chaos/liveness_test.go). The seed is in each summary and in the replay line;
# TENURE_CHAOS_SEED=N fixes it for every run. -v so that the summary
# (faults, rejections, violations, recovery and hand-off times) is in the
# output even when a run passes. The long runs: make chaos-soak, make
# chaos-failover.
chaos_run() {
	local name=$1
	shift
	echo "== chaos run ($name, ${TENURE_CHAOS_DURATION:-60s} of faults)"
	local log
	log=$(mktemp)
	if go test -count=1 -timeout 10m -v -run TestChaos ./integration/chaos \
		-chaos.duration "${TENURE_CHAOS_DURATION:-60s}" "$@" >"$log" 2>&1; then
		# The summary is logged twice (test log and stdout); print the last.
		awk '/^==== chaos summary/ { buf = ""; on = 1 } on { buf = buf $0 "\n" } END { printf "%s", buf }' "$log"
		rm -f "$log"
	else
		grep -v '^=== ' "$log" | tail -n 300
		echo "chaos run ($name) failed; full output: $log" >&2
		exit 1
	fi
}
chaos_run "classic protocol" -chaos.protocol classic
chaos_run "consumer protocol (KIP-848), shared commits" -chaos.protocol consumer -chaos.commit-transactions 1
chaos_run "on a pg_auto_failover formation" -chaos.postgres formation
chaos_run "strict hand-off (classic)" -chaos.protocol classic -chaos.strict
chaos_run "a transaction per batch (KIP-848, --commit-span 1)" -chaos.protocol consumer -chaos.commit-span 1
chaos_run "the newest kinds alone (strict, classic)" -chaos.protocol classic -chaos.strict \
	-chaos.kinds offsets-reset,add-partitions,rolling-restart,partition-multi-host
echo "== go test -race (core packages)"
go test -race -count=1 -timeout 15m ./partition/ ./sink/ ./consumer/
