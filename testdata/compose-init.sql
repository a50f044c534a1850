-- A guarded table for trying pgfence with docker compose.
CREATE TABLE accounts (
    id          bigint PRIMARY KEY,
    owner       text   NOT NULL,
    balance     bigint NOT NULL DEFAULT 0,
    fence_epoch bigint NOT NULL DEFAULT 0  -- token of the last writer of each row
);
INSERT INTO accounts (id, owner, balance) VALUES (1, 'alice', 100), (2, 'bob', 50);
