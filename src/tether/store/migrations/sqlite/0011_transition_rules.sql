-- tether schema, version 11 (SQLite): the legal transitions, written here once.
-- From this version on only migrations change the rules: a process no longer copies
-- its own table at start, so during a rolling deploy the last process to start does not
-- decide them. A test checks that this table equals the one in tether.states.
DELETE FROM tether_transitions;
INSERT INTO tether_transitions (from_state, to_state) VALUES
    ('blocked', 'cancelled'),
    ('blocked', 'queued'),
    ('failed', 'cancelled'),
    ('failed', 'queued'),
    ('paused', 'cancelled'),
    ('paused', 'failed'),
    ('paused', 'queued'),
    ('queued', 'cancelled'),
    ('queued', 'paused'),
    ('queued', 'running'),
    ('retrying', 'cancelled'),
    ('retrying', 'paused'),
    ('retrying', 'running'),
    ('running', 'blocked'),
    ('running', 'cancelled'),
    ('running', 'failed'),
    ('running', 'paused'),
    ('running', 'queued'),
    ('running', 'retrying'),
    ('running', 'succeeded');
