/* Generated from src/tether/states.py (JobState, TRANSITIONS); do not edit.
 * Regenerate: PYTHONPATH=src python -m tests.model.promela
 * tests/model/test_protocol_model.py fails when this file and states.py differ. */

#define QUEUED 0
#define BLOCKED 1
#define RUNNING 2
#define RETRYING 3
#define PAUSED 4
#define SUCCEEDED 5
#define FAILED 6
#define CANCELLED 7

#define LEGAL(f, t) ( \
    ((f) == QUEUED && ((t) == RUNNING || (t) == PAUSED || (t) == CANCELLED)) || \
    ((f) == BLOCKED && ((t) == QUEUED || (t) == CANCELLED)) || \
    ((f) == RUNNING && ((t) == QUEUED || (t) == BLOCKED || (t) == RETRYING || (t) == PAUSED || (t) == SUCCEEDED || (t) == FAILED || (t) == CANCELLED)) || \
    ((f) == RETRYING && ((t) == RUNNING || (t) == PAUSED || (t) == CANCELLED)) || \
    ((f) == PAUSED && ((t) == QUEUED || (t) == FAILED || (t) == CANCELLED)) || \
    ((f) == FAILED && ((t) == QUEUED || (t) == CANCELLED)))
