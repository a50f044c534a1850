-- pgbench script for the compat suite: each transaction sets the fencing
-- token (pgbench -D token=N) and bumps one row of the guarded table.
\set id random(1, 10)
SELECT set_config('fence.token', :token::text, false);
UPDATE compat_pgbench SET n = n + 1 WHERE id = :id;
