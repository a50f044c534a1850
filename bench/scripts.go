package main

// The pgbench scripts of the write benchmarks. Each transaction sets the
// client's fencing token and updates one random account; the hand-fenced
// scripts carry the same SET so that both sides send the same statements,
// and differ only in who writes the fence into the UPDATE.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

const accounts = 100000 * scale

const vars = `\set aid random(1, %d)
\set delta random(-5000, 5000)
`

// Fenced writes: one fresh writer per client, token 1000.
const fencedByPgfence = `SET fence.token = '1000';
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
`

const fencedByHand = `SET fence.token = '1000';
UPDATE pgbench_accounts SET abalance = abalance + :delta, fence_epoch = 1000 WHERE aid = :aid AND fence_epoch <= 1000;
`

// Fenced writes with a string value that changes, as drivers that
// interpolate send them (pgbench puts :delta into the literal in -M simple).
const fencedStrByPgfence = `SET fence.token = '1000';
UPDATE pgbench_accounts SET abalance = abalance + :delta, filler = 'note :delta' WHERE aid = :aid;
`

const fencedStrByHand = `SET fence.token = '1000';
UPDATE pgbench_accounts SET abalance = abalance + :delta, filler = 'note :delta', fence_epoch = 1000 WHERE aid = :aid AND fence_epoch <= 1000;
`

// Fenced writes in a transaction block, with the token set for the
// transaction only, as an application that shares connections sets it.
const fencedTxByPgfence = `BEGIN;
SET LOCAL fence.token = '1000';
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
COMMIT;
`

const fencedTxByHand = `BEGIN;
SET LOCAL fence.token = '1000';
UPDATE pgbench_accounts SET abalance = abalance + :delta, fence_epoch = 1000 WHERE aid = :aid AND fence_epoch <= 1000;
COMMIT;
`

// Stale-writer storm: every row is at epoch 2000 first; even clients hold
// the current token 2000, odd ones the stale 1000, whose every UPDATE is
// fenced.
const stormByPgfence = `\if :client_id % 2 = 0
SET fence.token = '2000';
\else
SET fence.token = '1000';
\endif
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
`

const stormByHand = `\if :client_id % 2 = 0
SET fence.token = '2000';
UPDATE pgbench_accounts SET abalance = abalance + :delta, fence_epoch = 2000 WHERE aid = :aid AND fence_epoch <= 2000;
\else
SET fence.token = '1000';
UPDATE pgbench_accounts SET abalance = abalance + :delta, fence_epoch = 1000 WHERE aid = :aid AND fence_epoch <= 1000;
\endif
`

// Upserts (issue 30's write shapes): one row, and three rows of one
// VALUES list, each new or an update of an existing account.
const upsertByPgfence = `SET fence.token = '1000';
INSERT INTO pgbench_accounts (aid, bid, abalance, filler) VALUES (:aid, 1, :delta, 'u') ON CONFLICT (aid) DO UPDATE SET abalance = pgbench_accounts.abalance + EXCLUDED.abalance;
`

const upsertByHand = `SET fence.token = '1000';
INSERT INTO pgbench_accounts (aid, bid, abalance, filler, fence_epoch) VALUES (:aid, 1, :delta, 'u', 1000) ON CONFLICT (aid) DO UPDATE SET abalance = pgbench_accounts.abalance + EXCLUDED.abalance, fence_epoch = 1000 WHERE pgbench_accounts.fence_epoch <= 1000;
`

const upsert3ByPgfence = `\set aid2 (:aid %% %[1]d) + 1
\set aid3 (:aid2 %% %[1]d) + 1
SET fence.token = '1000';
INSERT INTO pgbench_accounts (aid, bid, abalance, filler) VALUES (:aid, 1, :delta, 'u'), (:aid2, 1, :delta, 'u'), (:aid3, 1, :delta, 'u') ON CONFLICT (aid) DO UPDATE SET abalance = pgbench_accounts.abalance + EXCLUDED.abalance;
`

const upsert3ByHand = `\set aid2 (:aid %% %[1]d) + 1
\set aid3 (:aid2 %% %[1]d) + 1
SET fence.token = '1000';
INSERT INTO pgbench_accounts (aid, bid, abalance, filler, fence_epoch) VALUES (:aid, 1, :delta, 'u', 1000), (:aid2, 1, :delta, 'u', 1000), (:aid3, 1, :delta, 'u', 1000) ON CONFLICT (aid) DO UPDATE SET abalance = pgbench_accounts.abalance + EXCLUDED.abalance, fence_epoch = 1000 WHERE pgbench_accounts.fence_epoch <= 1000;
`

// More shapes: a DELETE whose IN list has 1 to 10 entries (of accounts
// beyond the table: it deletes nothing, so the table stays as it is), an
// INSERT of 1 to 3 rows into pgbench_fenced_log (pgbench_history's shape
// with an epoch column), an INSERT ... SELECT upsert of 5 accounts, and a
// writable CTE that updates an account and logs it.
const shapeVars = `\set n random(1, 3)
\set far :aid + %[1]d
`

// deleteInLengths is how many entries the DELETE's IN list has, at random:
// each length is a text (and through pgfence a statement) of its own.
const deleteInLengths = 10

// deleteInScript is the DELETE of 1 to deleteInLengths accounts beyond the
// table, with its fence written by hand or not.
func deleteInScript(hand bool) string {
	var b strings.Builder
	b.WriteString(fmt.Sprintf("\\set len random(1, %d)\nSET fence.token = '1000';\n", deleteInLengths))
	fence := ""
	if hand {
		fence = " AND fence_epoch <= 1000"
	}
	for n := 1; n <= deleteInLengths; n++ {
		switch n {
		case 1:
			b.WriteString("\\if :len = 1\n")
		default:
			fmt.Fprintf(&b, "\\elif :len = %d\n", n)
		}
		list := []string{":far"}
		for k := 1; k < n; k++ {
			list = append(list, fmt.Sprintf(":far + %d", k))
		}
		fmt.Fprintf(&b, "DELETE FROM pgbench_accounts WHERE aid IN (%s)%s;\n", strings.Join(list, ", "), fence)
	}
	b.WriteString("\\endif\n")
	return b.String()
}

const insertRowsByPgfence = `SET fence.token = '1000';
\if :n = 1
INSERT INTO pgbench_fenced_log (tid, bid, aid, delta, mtime) VALUES (1, 1, :aid, :delta, now());
\elif :n = 2
INSERT INTO pgbench_fenced_log (tid, bid, aid, delta, mtime) VALUES (1, 1, :aid, :delta, now()), (2, 1, :aid, :delta, now());
\else
INSERT INTO pgbench_fenced_log (tid, bid, aid, delta, mtime) VALUES (1, 1, :aid, :delta, now()), (2, 1, :aid, :delta, now()), (3, 1, :aid, :delta, now());
\endif
`

const insertRowsByHand = `SET fence.token = '1000';
\if :n = 1
INSERT INTO pgbench_fenced_log (tid, bid, aid, delta, mtime, fence_epoch) VALUES (1, 1, :aid, :delta, now(), 1000);
\elif :n = 2
INSERT INTO pgbench_fenced_log (tid, bid, aid, delta, mtime, fence_epoch) VALUES (1, 1, :aid, :delta, now(), 1000), (2, 1, :aid, :delta, now(), 1000);
\else
INSERT INTO pgbench_fenced_log (tid, bid, aid, delta, mtime, fence_epoch) VALUES (1, 1, :aid, :delta, now(), 1000), (2, 1, :aid, :delta, now(), 1000), (3, 1, :aid, :delta, now(), 1000);
\endif
`

const insertSelectByPgfence = `\set b random(1, %[1]d - 5)
SET fence.token = '1000';
INSERT INTO pgbench_accounts (aid, bid, abalance, filler) SELECT g, 1, :delta, 's' FROM generate_series(:b, :b + 4) g ON CONFLICT (aid) DO UPDATE SET abalance = pgbench_accounts.abalance + EXCLUDED.abalance;
`

const insertSelectByHand = `\set b random(1, %[1]d - 5)
SET fence.token = '1000';
INSERT INTO pgbench_accounts (aid, bid, abalance, filler, fence_epoch) SELECT g, 1, :delta, 's', 1000 FROM generate_series(:b, :b + 4) g ON CONFLICT (aid) DO UPDATE SET abalance = pgbench_accounts.abalance + EXCLUDED.abalance, fence_epoch = 1000 WHERE pgbench_accounts.fence_epoch <= 1000;
`

const cteByPgfence = `SET fence.token = '1000';
WITH u AS (UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid RETURNING aid) INSERT INTO pgbench_fenced_log (tid, bid, aid, delta, mtime) SELECT 1, 1, aid, :delta, now() FROM u;
`

const cteByHand = `SET fence.token = '1000';
WITH u AS (UPDATE pgbench_accounts SET abalance = abalance + :delta, fence_epoch = 1000 WHERE aid = :aid AND fence_epoch <= 1000 RETURNING aid) INSERT INTO pgbench_fenced_log (tid, bid, aid, delta, mtime, fence_epoch) SELECT 1, 1, aid, :delta, now(), 1000 FROM u;
`

// A lock-domain write fenced by hand as pgfence fences it: claim the domain
// for the token (its row lock serialises the domain's writers, as pgfence's
// claim does), then write only if the claim held.
const domainByHand = `SET fence.token = '1000';
WITH d AS (UPDATE pgfence.domains SET token = 1000 WHERE domain = 'bench' AND token <= 1000 RETURNING token) UPDATE pgbench_accounts SET abalance = abalance + :delta, fence_epoch = 1000 WHERE aid = :aid AND fence_epoch <= 1000 AND EXISTS (SELECT 1 FROM d);
`

// writeScripts writes the scripts into dir and returns their paths by name.
func writeScripts(dir string) (map[string]string, error) {
	paths := map[string]string{}
	for name, body := range map[string]string{
		"fenced-pgfence": fencedByPgfence, "fenced-hand": fencedByHand,
		"fenced-str-pgfence": fencedStrByPgfence, "fenced-str-hand": fencedStrByHand,
		"fenced-tx-pgfence": fencedTxByPgfence, "fenced-tx-hand": fencedTxByHand,
		"storm-pgfence": stormByPgfence, "storm-hand": stormByHand,
		"upsert-pgfence": upsertByPgfence, "upsert-hand": upsertByHand,
		"upsert3-pgfence": fmt.Sprintf(upsert3ByPgfence, accounts), "upsert3-hand": fmt.Sprintf(upsert3ByHand, accounts),
		"delete-in-pgfence": fmt.Sprintf(shapeVars, accounts) + deleteInScript(false), "delete-in-hand": fmt.Sprintf(shapeVars, accounts) + deleteInScript(true),
		"insert-rows-pgfence": fmt.Sprintf(shapeVars, accounts) + insertRowsByPgfence, "insert-rows-hand": fmt.Sprintf(shapeVars, accounts) + insertRowsByHand,
		"insert-select-pgfence": fmt.Sprintf(insertSelectByPgfence, accounts), "insert-select-hand": fmt.Sprintf(insertSelectByHand, accounts),
		"cte-pgfence": cteByPgfence, "cte-hand": cteByHand,
		"domain-hand": domainByHand,
	} {
		p := filepath.Join(dir, name+".sql")
		if err := os.WriteFile(p, []byte(fmt.Sprintf(vars, accounts)+body), 0o644); err != nil {
			return nil, err
		}
		paths[name] = p
	}
	return paths, nil
}

// writeRewrittenScript writes "fenced-rewrite-by-hand": the statements
// pgfence sends Postgres for the fenced-writes script, as `pgfence rewrite`
// prints them, sent straight to Postgres. It separates what the rewritten
// SQL costs Postgres from what the proxy costs. It approximates pgfence's
// traffic: pgfence appends the probe to the UPDATE's Query (simple) or
// injects it into the same batch, parsed each time (extended, prepared);
// here it is a statement of its own (its own round trip; prepared once
// with -M prepared).
func writeRewrittenScript(dir, pgfenceBin string, scripts map[string]string) error {
	update, probe, err := rewrittenUpdate(pgfenceBin)
	if err != nil {
		return err
	}
	body := fmt.Sprintf(vars, accounts) + "SET fence.token = '1000';\n" + update + ";\n" + probe + ";\n"
	p := filepath.Join(dir, "fenced-rewrite-by-hand.sql")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		return err
	}
	scripts["fenced-rewrite-by-hand"] = p
	return nil
}

// rewrittenUpdate returns what `pgfence rewrite --prepared` makes of the
// fenced-writes UPDATE, with the policy flags in args: the UPDATE, its
// parameters turned into the scripts' :delta and :aid, and the probe
// pgfence runs after it.
func rewrittenUpdate(pgfenceBin string, args ...string) (update, probe string, err error) {
	args = append(append([]string{"rewrite", "--guard", "pgbench_accounts", "--prepared"}, args...),
		"UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2")
	out, err := exec.Command(pgfenceBin, args...).CombinedOutput()
	if err != nil {
		return "", "", fmt.Errorf("pgfence rewrite: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		switch {
		case strings.HasPrefix(line, "--   SELECT "):
			probe = strings.TrimPrefix(line, "--   ")
		case strings.HasPrefix(line, "--"):
		default:
			update += line + "\n"
		}
	}
	update = strings.TrimSpace(update)
	if probe == "" || !strings.Contains(update, "$1") || !strings.Contains(update, "$2") {
		return "", "", fmt.Errorf("unexpected pgfence rewrite output:\n%s", out)
	}
	return strings.NewReplacer("$1", ":delta", "$2", ":aid").Replace(update), probe, nil
}
