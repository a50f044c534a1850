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
	out, err := exec.Command(pgfenceBin, "rewrite", "--guard", "pgbench_accounts", "--prepared",
		"UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgfence rewrite: %v\n%s", err, out)
	}
	var update, probe string
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
		return fmt.Errorf("unexpected pgfence rewrite output:\n%s", out)
	}
	update = strings.NewReplacer("$1", ":delta", "$2", ":aid").Replace(update)
	body := fmt.Sprintf(vars, accounts) + "SET fence.token = '1000';\n" + update + ";\n" + probe + ";\n"
	p := filepath.Join(dir, "fenced-rewrite-by-hand.sql")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		return err
	}
	scripts["fenced-rewrite-by-hand"] = p
	return nil
}
