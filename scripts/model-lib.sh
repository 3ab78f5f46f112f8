# shellcheck shell=bash
# Sourced by scripts/model-check.sh and scripts/model-check-strict.sh: what
# both do before their runs, and how both prepare a run, read pan's output
# and judge a run's end against the expected one. Each script keeps its own
# run(): what counts as which end differs (the strict model tells its
# properties apart).

# model_setup NAME: checks that spin and a C compiler are installed (NAME is
# the script's name in the message), makes the work directory $work
# (removed on exit) and sets failed=0.
model_setup() {
	local tool
	for tool in spin gcc; do
		command -v "$tool" >/dev/null || { echo "$1: $tool is not installed (apt-get install spin gcc)" >&2; exit 1; }
	done
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	failed=0
}

# run_dir NAME MODEL DEFINES...: sets dir to run NAME's directory under
# $work, with a copy of MODEL and the run's DEFINES (one a line), which a
# counterexample's replay reads back.
run_dir() {
	local name=$1 model=$2
	shift 2
	dir=$work/$name
	mkdir -p "$dir"
	cp "$model" "$dir/"
	printf '%s\n' "$@" >"$dir/defines"
}

# pan_read OUT: sets states (stored), errors and complete (yes, or no when
# pan says the search was not completed) from pan's output file OUT.
pan_read() {
	states=$(awk '/states, stored/ { print $1; exit }' "$1")
	errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$1" | head -n 1)
	complete=yes
	if grep -q "Search not completed" "$1"; then
		complete=no
	fi
}

# judge GOT EXPECT: sets verdict (the caller's) to ok, or to UNEXPECTED and
# failed=1 when the run ended as GOT, not as EXPECT.
judge() {
	verdict=ok
	if [[ $1 != "$2" ]]; then
		verdict=UNEXPECTED
		failed=1
	fi
}

# show_unexpected OUT: after a run's line, the end of its pan output OUT
# when judge found it UNEXPECTED.
show_unexpected() {
	if [[ $verdict != ok ]]; then
		sed 's/^/    | /' "$1" | tail -n 30
	fi
}
