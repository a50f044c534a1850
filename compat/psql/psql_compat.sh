#!/usr/bin/env bash
# pgfence compatibility checks for psql: simple query protocol, SQL-level
# PREPARE/EXECUTE, COPY FROM/TO STDIN/STDOUT, notifications, and SIGINT
# (psql's cancel: it sends a CancelRequest). psql 15 has no bound
# parameters (\bind is psql 16). Prints "ok NAME" or "FAIL NAME: why".
set -uo pipefail

URL=$COMPAT_PROXY_URL
T=$COMPAT_TABLE
echo "driver $(psql --version)"

# psql through the proxy: no psqlrc, unaligned tuples only, command tags kept.
q() { psql "$URL" -X -A -t -v VERBOSITY=verbose "$@"; }

failed=0
check() {
	local name=$1 out
	# COMPAT_ONLY, if set, names the checks to run (comma-separated).
	if [ -n "${COMPAT_ONLY:-}" ] && [[ ",$COMPAT_ONLY," != *",$name,"* ]]; then
		return
	fi
	if out=$("$name" 2>&1); then
		echo "ok $name"
	else
		failed=1
		echo "FAIL $name: $(printf '%s' "$out" | tr '\n' ' ')"
	fi
}
# expect_in OUTPUT LINE: OUTPUT has LINE as one of its lines.
expect_in() {
	grep -qxF -- "$2" <<<"$1" || { printf 'expected the line %q in:\n%s\n' "$2" "$1"; return 1; }
}

tx_commit() {
	local out
	out=$(q -v ON_ERROR_STOP=1 <<-SQL
		SET fence.token = '10';
		BEGIN;
		INSERT INTO $T (id, val) VALUES (100, 'committed');
		COMMIT;
		SELECT val FROM $T WHERE id = 100;
	SQL
	) || { echo "$out"; return 1; }
	expect_in "$out" "committed"
}

tx_rollback() {
	local out
	out=$(q -v ON_ERROR_STOP=1 <<-SQL
		SET fence.token = '10';
		BEGIN;
		INSERT INTO $T (id, val) VALUES (101, 'rolled back');
		UPDATE $T SET val = 'rolled back' WHERE id = 3;
		ROLLBACK;
		SELECT string_agg(id || ':' || val, ',') FROM $T WHERE id IN (3, 101);
	SQL
	) || { echo "$out"; return 1; }
	expect_in "$out" "UPDATE 1" && expect_in "$out" "3:init"
}

prepared_reuse() {
	local out
	out=$({
		echo "SET fence.token = '10';"
		echo "PREPARE bump(int) AS UPDATE $T SET n = n + 1 WHERE id = \$1;"
		for _ in $(seq 20); do echo "EXECUTE bump(2);"; done
	} | q -v ON_ERROR_STOP=1) || { echo "$out"; return 1; }
	[ "$(grep -cxF 'UPDATE 1' <<<"$out")" -eq 20 ] || { echo "want 20 x UPDATE 1, got: $out"; return 1; }
}

error_recovery() {
	local out
	out=$(q <<-SQL 2>&1
		SELECT 1/0;
		BEGIN;
		SELECT 1/0;
		ROLLBACK;
		SELECT 'alive';
	SQL
	)
	expect_in "$out" "ERROR:  22012: division by zero" && expect_in "$out" "alive"
}

copy_in() {
	local out
	out=$(q -v ON_ERROR_STOP=1 <<-SQL
		COPY $COMPAT_PLAIN_TABLE (id, val) FROM STDIN;
		1	a
		2	b
		3	c
		\.
	SQL
	) || { echo "$out"; return 1; }
	expect_in "$out" "COPY 3"
}

copy_out() {
	local out
	out=$(q -v ON_ERROR_STOP=1 -c "COPY $T (id, val) TO STDOUT") || { echo "$out"; return 1; }
	expect_in "$out" "$(printf '5\tinit')"
}

listen_notify() {
	# psql prints a notification after the command during which it arrived.
	local out
	out=$(q -v ON_ERROR_STOP=1 <<-SQL
		LISTEN $COMPAT_CHANNEL;
		\! psql '$URL' -X -q -c "NOTIFY $COMPAT_CHANNEL, 'hello'"
		SELECT pg_sleep(0.2);
	SQL
	) || { echo "$out"; return 1; }
	grep -q "^Asynchronous notification \"$COMPAT_CHANNEL\" with payload \"hello\" received" <<<"$out" ||
		{ echo "no notification in: $out"; return 1; }
}

cancel() {
	# SIGINT makes psql send a CancelRequest for the running query (and then
	# quit, as psql does when it runs a script: the session ends with it).
	# The signal is sent once the query runs (seen straight on Postgres):
	# earlier, psql may not have its handler yet.
	local tmp out start elapsed pid app=compat_psql_cancel_$$
	tmp=$(mktemp)
	start=$(date +%s%N)
	psql "$URL&application_name=$app" -X -v VERBOSITY=verbose -c "SELECT pg_sleep(30)" >"$tmp" 2>&1 &
	pid=$!
	for _ in $(seq 100); do
		[ "$(psql "$COMPAT_DIRECT_URL" -X -A -t -c "SELECT count(*) FROM pg_stat_activity
			WHERE application_name = '$app' AND state = 'active'")" = 1 ] && break
		sleep 0.1
	done
	kill -INT "$pid"
	wait "$pid"
	elapsed=$(( ($(date +%s%N) - start) / 1000000 ))
	out=$(cat "$tmp")
	rm -f "$tmp"
	expect_in "$out" "ERROR:  57014: canceling statement due to user request" || return 1
	[ "$elapsed" -lt 10000 ] || { echo "cancelled after $elapsed ms"; return 1; }
}

fenced_write() {
	local b a
	b=$(q -v ON_ERROR_STOP=1 -c "SET fence.token = '43'" -c "UPDATE $T SET val = 'B' WHERE id = 1") || { echo "$b"; return 1; }
	expect_in "$b" "UPDATE 1" || return 1
	a=$(q -v ON_ERROR_STOP=1 -c "SET fence.token = '42'" -c "UPDATE $T SET val = 'A' WHERE id = 1" -c "SELECT val FROM $T WHERE id = 1") || { echo "$a"; return 1; }
	expect_in "$a" "UPDATE 0" && expect_in "$a" "B"
}

# Plain SETs, each answered by pgfence itself (the session is idle).
token_set() {
	local out
	out=$(q -v ON_ERROR_STOP=1 <<-SQL
		SET fence.token = '11';
		INSERT INTO $T (id, val) VALUES (103, 'tokenset');
		SET fence.token = '9';
		UPDATE $T SET val = 'stale' WHERE id = 103;
		SET fence.token = '11';
		UPDATE $T SET n = n + 1 WHERE id = 103;
	SQL
	) || { echo "$out"; return 1; }
	[ "$(grep -c '^UPDATE 1$' <<<"$out")" = 1 ] && expect_in "$out" "INSERT 0 1" && expect_in "$out" "UPDATE 0"
}

# SET LOCAL in each transaction, answered by pgfence too (the block is
# open, nothing in flight).
token_set_local() {
	local out
	out=$(q -v ON_ERROR_STOP=1 <<-SQL
		BEGIN;
		SET LOCAL fence.token = '12';
		INSERT INTO $T (id, val) VALUES (104, 'tokenlocal');
		COMMIT;
		BEGIN;
		SET LOCAL fence.token = '9';
		UPDATE $T SET val = 'stale' WHERE id = 104;
		COMMIT;
		BEGIN;
		SET LOCAL fence.token = '12';
		UPDATE $T SET n = n + 1 WHERE id = 104;
		COMMIT;
	SQL
	) || { echo "$out"; return 1; }
	[ "$(grep -c '^UPDATE 1$' <<<"$out")" = 1 ] && expect_in "$out" "INSERT 0 1" && expect_in "$out" "UPDATE 0"
}

for c in tx_commit tx_rollback prepared_reuse error_recovery copy_in copy_out listen_notify cancel fenced_write token_set token_set_local; do
	check "$c"
done
exit "$failed"
