/*
 * tether's lease protocol, as a SPIN model: claim, fenced writes, heartbeats,
 * self-fencing, the leader's rescue, cancel, pause, release on shutdown, the
 * maintenance leader; with crashes, stalls (SIGSTOP), lost and delayed messages,
 * foreign row locks and a database clock that steps.
 *
 * README.md (next to this file) maps every part to the code and says what is
 * abstracted. tests/model/test_protocol_model.py checks it in `make test`.
 *
 * Time is discrete: one tick is one heartbeat interval, and every clock in the
 * model advances at the same rate (the monotonic clocks' rate-equality assumption).
 * A live, running process does each of its periodic rounds once per tick (the
 * Clock waits for them); a stalled one does nothing until it resumes, however many
 * ticks that takes. The database clock may also step forward (NTP after a resume, or
 * one SQLite process's wall clock ahead of another's): every lease and the leader's
 * row then look expired at once.
 */

#include "states.pml"   /* QUEUED .. CANCELLED and LEGAL(from, to): generated from states.py */

#ifndef NW
#define NW 2            /* workers */
#endif
#ifndef NJ
#define NJ 2            /* jobs */
#endif

#ifndef L
#define L        3      /* lease duration, in ticks */
#endif
#ifndef MARGIN
#define MARGIN   1      /* self_fence_margin */
#endif
#define FENCE    (L - MARGIN)
#define TTL      2      /* the maintenance leader's lease */
#define MAXATT   2      /* max_attempts */

#define NONE     255
#define NOBS     255    /* the rescuer is not watching this job */
#define IDX(w, j) ((w) * NJ + (j))
#define ALLW     ((1 << NW) - 1)

/* cancellation records */
#define NOREC    0
#define PENDING  1
#define SETTLED  2

/* ---------------------------------------------------------------- the database */
byte st[NJ];            /* state */
byte tok[NJ];           /* lease_token */
byte own[NJ] = NONE;    /* worker_id, NONE unless running */
bool jumped[NJ];        /* the database clock stepped past lease_expires_at */
byte att[NJ];           /* attempt */
bool creq[NJ];          /* cancel_requested_at is set */
bool preq[NJ];          /* pause_requested_at is set */
byte crec[NJ];          /* the cancellation record of a running job's cancel */
byte extd[NJ];          /* bit r: the lease changed since rescuer r last looked */
bool flock[NJ];         /* a foreign transaction holds the row */
byte lholder = NONE;    /* tether_leaders: holder */
byte lttl;              /* tether_leaders: ticks left, by the database clock */

/* ---------------------------------------------------------------- the workers */
bool alive[NW] = 1;     /* the process exists */
bool stalled[NW];       /* SIGSTOP */
byte held[NW * NJ];      /* the lease token of the attempt this worker executes (0: none) */
byte age[NW * NJ];      /* ticks since the attempt's lease was last confirmed (claim, or
                           the SEND of the last heartbeat that extended it) */
byte intr[NW * NJ];     /* the attempt was interrupted: CANCELLED or PAUSED (0: no) */
bool hb[NW];            /* a heartbeat is on its way to the database */
byte hbage[NW];         /* ticks since that heartbeat was sent */
byte hbtok[NW * NJ];    /* the tokens it carries */
bool done[NW];          /* the worker's round ran this tick */
byte obs[NW * NJ] = NOBS; /* the rescuer's watch on each job: ticks, by its own monotonic
                           clock, since it last saw the job's lease change (NOBS: none) */
bool notif[NJ];         /* a NOTIFY about a request, on its way to the job's worker */

/* ---------------------------------------------------------------- ghosts and faults */
/* Fault budgets. Each check runs every scenario the SCENARIOS mask selects: init
 * picks one, so one search covers them all, and a trail names its scenario. All of
 * them at once would take minutes to search; each scenario pairs the faults that
 * interact (see README.md). */
#define S_CRASH    1      /* a SIGKILL or a shutdown, and a stall */
#define S_CLOCK    2      /* a stall, a database clock step */
#define S_NETWORK  4      /* a delayed heartbeat, a lost message */
#define S_REQUESTS 8      /* a cancel, pause or retry; a parent; a lost message */
#define S_LOCKS    16     /* a foreign transaction on a job row */
#ifndef SCENARIOS
#define SCENARIOS (S_CRASH | S_CLOCK | S_NETWORK | S_REQUESTS | S_LOCKS)
#endif
byte scenario;
byte exits;             /* crashes (SIGKILL) and graceful shutdowns (at most NW - 1) */
byte stalls;            /* SIGSTOPs (each followed, some day, by SIGCONT) */
byte steps;             /* forward steps of the database clock */
byte delays;            /* heartbeats that reach the database only at some later moment */
byte losses;            /* lost messages: heartbeats, their answers, NOTIFYs, leader answers */
byte flocks;            /* foreign transactions holding a job row */
byte ops;               /* a person's cancel / pause / retry */
byte child;             /* a job that waits for its children */

/* ---------------------------------------------------------------- the protocol */

/* The state machine: every state change goes through MOVE, which refuses any
 * transition that states.py does not list (the transition trigger's job). */
#define MOVE(j, to) assert(LEGAL(st[j], to)); st[j] = to

/* A job leaves running: its lease and its requests go with it. */
#define LEAVE(j, to) \
    MOVE(j, to); own[j] = NONE; jumped[j] = 0; creq[j] = 0; preq[j] = 0; \
    notif[j] = 0; extd[j] = 0

/* Fencing: every worker write matches id, lease_token and state = 'running'. */
#define FENCED(j, t) (tok[j] == (t) && st[j] == RUNNING)

/* An accepted worker write comes from the job's latest attempt: no stale token. */
#define ACCEPTED(j, t) assert((t) == tok[j])

/* Design switches, off in the protocol checked (README.md, "The protocol checked"):
 * SKIPPED_RENEWS: a heartbeat's answer also renews the fence point of a row it skipped;
 * WORKER_BEATS: the rescuer watches the worker's heartbeat counter, not each lease. */
#ifndef SKIPPED_RENEWS
#define SKIPPED_RENEWS 0
#endif
#ifndef WORKER_BEATS
#define WORKER_BEATS 0
#endif

/* The rescue of a running job whose worker is not known dead: its lease expired
 * by the database clock AND this rescuer has watched the lease not change for L
 * ticks of its own monotonic clock. The database clock runs at the same rate as the
 * monotonic ones, so L ticks unchanged are L ticks of database time too, unless the
 * clock stepped forward (jumped): then the lease looks expired at once. */
#define WATCHED(w, j)   (obs[IDX(w, j)] != NOBS && obs[IDX(w, j)] >= L)
#define DBEXPIRED(w, j) (jumped[j] || WATCHED(w, j))
#define STALE(w, j) (DBEXPIRED(w, j) && WATCHED(w, j))

/* What an attempt's end writes, fenced. A pending cancel wins over anything that
 * would revive the job; a pending pause over a retry or a release. Success and a
 * failure with no attempts left stand (the cancellation record says so). */
inline finish(w, j, t, out) {
    if
    :: FENCED(j, t) ->
        ACCEPTED(j, t);
        if
        :: out == SUCCEEDED || out == FAILED || out == CANCELLED -> LEAVE(j, out)
        :: else ->
            if
            :: creq[j] -> LEAVE(j, CANCELLED)
            :: !creq[j] && (preq[j] || out == PAUSED) ->
                att[j] = att[j] - 1;       /* a pause spends no attempt */
                LEAVE(j, PAUSED)
            :: !creq[j] && !preq[j] && out == QUEUED ->
                att[j] = att[j] - 1;       /* a release spends no attempt */
                LEAVE(j, QUEUED)
            :: !creq[j] && !preq[j] && out != PAUSED && out != QUEUED -> LEAVE(j, out)
            fi
        fi
    :: else -> skip                        /* zero rows: the lease is lost, record nothing */
    fi
}

/* The attempt stops executing. */
#define STOP(w, j) held[IDX(w, j)] = 0; age[IDX(w, j)] = 0; intr[IDX(w, j)] = 0

/* The rescue itself (one fenced, row-locked UPDATE): the token is bumped. No live
 * worker's job is rescued: the attempt it takes over is not one its worker still
 * trusts (past its fence point, or gone). */
inline rescue(j) {
    assert(!(held[IDX(own[j], j)] == tok[j] && age[IDX(own[j], j)] < FENCE));
    tok[j] = tok[j] + 1;
    if
    :: creq[j] -> LEAVE(j, CANCELLED)
    :: !creq[j] && preq[j] -> LEAVE(j, PAUSED)
    :: !creq[j] && !preq[j] && att[j] < MAXATT -> LEAVE(j, RETRYING)
    :: !creq[j] && !preq[j] && att[j] >= MAXATT -> LEAVE(j, FAILED)
    fi
}

/* Claim (FOR UPDATE SKIP LOCKED): lease_token + 1, a lease of L by the database clock. */
inline claim(w, j) {
    if
    :: (st[j] == QUEUED || st[j] == RETRYING) && !flock[j] && held[IDX(w, j)] == 0 ->
        MOVE(j, RUNNING);
        tok[j] = tok[j] + 1; own[j] = w; jumped[j] = 0;
        if :: att[j] < MAXATT -> att[j] = att[j] + 1 :: else -> skip fi;
        extd[j] = ALLW;
        held[IDX(w, j)] = tok[j]; age[IDX(w, j)] = 0; intr[IDX(w, j)] = 0
    :: else -> skip
    fi
}

/* The rescuer's pass over one job (maintenance/rescuer.py, store RESCUE). */
inline rescue_pass(w, j) {
    if
    :: st[j] == RUNNING ->
        if
        :: extd[j] & (1 << w) -> extd[j] = extd[j] & ~(1 << w); obs[IDX(w, j)] = 0
        :: !(extd[j] & (1 << w)) && obs[IDX(w, j)] == NOBS -> obs[IDX(w, j)] = 0
        :: else -> skip
        fi;
        if
        :: !flock[j] && (!alive[own[j]] || STALE(w, j)) -> rescue(j); obs[IDX(w, j)] = NOBS
        :: else -> skip                    /* SKIP LOCKED, or not due */
        fi
    :: else -> obs[IDX(w, j)] = NOBS
    fi
}

/* The follow-up settles a record once its job no longer runs, whoever died. */
#define FOLLOW_UP(j) if :: crec[j] == PENDING && st[j] != RUNNING -> crec[j] = SETTLED :: else -> skip fi

/* A request reaches the worker (NOTIFY, or the heartbeat's answer): it interrupts
 * the attempt, which then ends with that outcome (the handler writes it). */
#define HEAR(w, j) \
    if :: creq[j] -> intr[IDX(w, j)] = CANCELLED \
       :: !creq[j] && preq[j] -> intr[IDX(w, j)] = PAUSED \
       :: else -> skip fi

#define ACTIVE(w) (alive[w] && !stalled[w])

/* The heartbeat reaches the database: one write for all the worker's leases, each
 * matched by its token (zero rows: the lease is lost); a row a foreign transaction
 * holds is skipped, neither extended nor lost. If `heard`, the answer reaches the
 * worker: it renews the fence point of the leases extended (measured from the SEND),
 * stops the attempts whose leases are lost, and hears the pending requests. */
inline beat(w, j, heard) {
    if
    :: hbtok[IDX(w, j)] == 0 -> skip
    :: hbtok[IDX(w, j)] != 0 && flock[j] ->
        if
        :: heard && SKIPPED_RENEWS && held[IDX(w, j)] == hbtok[IDX(w, j)] &&
           hbage[w] < age[IDX(w, j)] -> age[IDX(w, j)] = hbage[w]
        :: else -> skip
        fi
    :: hbtok[IDX(w, j)] != 0 && !flock[j] && FENCED(j, hbtok[IDX(w, j)]) ->
        ACCEPTED(j, hbtok[IDX(w, j)]);
        jumped[j] = 0; extd[j] = ALLW;
        if
        :: heard && held[IDX(w, j)] == hbtok[IDX(w, j)] ->
            if :: hbage[w] < age[IDX(w, j)] -> age[IDX(w, j)] = hbage[w] :: else -> skip fi;
            if :: intr[IDX(w, j)] == 0 -> HEAR(w, j) :: else -> skip fi
        :: else -> skip
        fi
    :: hbtok[IDX(w, j)] != 0 && !flock[j] && !FENCED(j, hbtok[IDX(w, j)]) ->
        if
        :: heard && held[IDX(w, j)] == hbtok[IDX(w, j)] -> STOP(w, j)  /* lease lost */
        :: else -> skip
        fi
    fi;
    hbtok[IDX(w, j)] = 0
}

/* The worker's heartbeat counter (tether_workers.beats) advanced: a rescuer that
 * watches the WORKER's counter, not each lease, restarts its watch of all the jobs
 * that worker holds. Off in the protocol checked; see README.md. */
inline counted(w, j) {
    if
    :: WORKER_BEATS && st[j] == RUNNING && own[j] == w -> extd[j] = ALLW
    :: else -> skip
    fi
}

/* Invariants (safety). An attempt is effective while it executes and its writes would
 * count (its token is the job's); it is within its lease while it executes and its
 * worker, by its own clock, has not reached the fence point. */
#define EFFECTIVE(w, j) (held[IDX(w, j)] != 0 && held[IDX(w, j)] == tok[j] && st[j] == RUNNING)
#define INLEASE(w, j)   (held[IDX(w, j)] != 0 && age[IDX(w, j)] < FENCE)
#define PAIR(P, a, b, j) !(P(a, j) && P(b, j))
#if NW == 2
#define ATMOSTONE(P, j) (PAIR(P, 0, 1, j))
#else
#define ATMOSTONE(P, j) (PAIR(P, 0, 1, j) && PAIR(P, 0, 2, j) && PAIR(P, 1, 2, j))
#endif
/* No lost job: every job is in one of the eight states; a running job names its
 * worker and its latest token, any other job names no worker. */
#define KEPT(j) (st[j] <= CANCELLED && \
    ((st[j] == RUNNING && own[j] < NW && tok[j] > 0) || \
     (st[j] != RUNNING && own[j] == NONE)))
#define INV(j) (ATMOSTONE(EFFECTIVE, j) && ATMOSTONE(INLEASE, j) && KEPT(j))
#if NJ == 2
#define SAFE (INV(0) && INV(1))
#else
#define SAFE (INV(0) && INV(1) && INV(2))
#endif

/* ---------------------------------------------------------------- processes */

/* One worker process: its heartbeater and claimer, its maintenance services (leader
 * election, rescuer, follow-up), its listener, its self-fencing, and shutdown. */
active [NW] proctype Worker() {
    byte w = _pid;      /* the workers are the first processes: pids 0 .. NW - 1 */
    byte j;
    bool lead;
    scenario != 0;      /* the world is set up */
end:
    do
    :: atomic { ACTIVE(w) && !done[w] ->
        /* Leader election: take or renew the row (TTL of database time); lead this
         * round if the answer says so. */
        if
        :: lholder == w || lholder == NONE || lttl == 0 ->
            lholder = w; lttl = TTL;
            if
            :: lead = 1
            :: losses > 0 -> losses--      /* the answer is lost: not sure, so not leading */
            fi
        :: else -> skip
        fi;
        /* The leader's duties: rescue, then settle the cancellation records. */
        if
        :: lead ->
            for (j : 0 .. NJ - 1) { rescue_pass(w, j) };
            for (j : 0 .. NJ - 1) { FOLLOW_UP(j) }
        :: else -> skip
        fi;
        /* Heartbeater: one write per interval. A call still unanswered has timed
         * out; it may yet reach the database, and the next round waits for it. */
        if
        :: !hb[w] ->
            for (j : 0 .. NJ - 1) { hbtok[IDX(w, j)] = held[IDX(w, j)] };
            hbage[w] = 0;
            if
            :: for (j : 0 .. NJ - 1) { counted(w, j); beat(w, j, 1) }  /* answered in time */
            :: delays > 0 -> delays--; hb[w] = 1   /* delayed: see Net */
            fi
        :: else -> skip
        fi;
        /* Claimer: every due job this worker does not already run. */
        for (j : 0 .. NJ - 1) { claim(w, j) };
        j = 0; lead = 0;
        done[w] = 1 }
    /* Self-fencing: past the fence point, stop the attempt and write nothing more. */
    :: atomic { ACTIVE(w) && held[IDX(w, 0)] != 0 && age[IDX(w, 0)] >= FENCE -> STOP(w, 0) }
    :: atomic { ACTIVE(w) && held[IDX(w, 1)] != 0 && age[IDX(w, 1)] >= FENCE -> STOP(w, 1) }
#if NJ > 2
    :: atomic { ACTIVE(w) && held[IDX(w, 2)] != 0 && age[IDX(w, 2)] >= FENCE -> STOP(w, 2) }
#endif
    /* Listener: a NOTIFY for a job this worker runs. */
    :: atomic { ACTIVE(w) && notif[0] && own[0] == w && held[IDX(w, 0)] != 0 ->
        notif[0] = 0; if :: intr[IDX(w, 0)] == 0 -> HEAR(w, 0) :: else -> skip fi }
    :: atomic { ACTIVE(w) && notif[1] && own[1] == w && held[IDX(w, 1)] != 0 ->
        notif[1] = 0; if :: intr[IDX(w, 1)] == 0 -> HEAR(w, 1) :: else -> skip fi }
#if NJ > 2
    :: atomic { ACTIVE(w) && notif[2] && own[2] == w && held[IDX(w, 2)] != 0 ->
        notif[2] = 0; if :: intr[IDX(w, 2)] == 0 -> HEAR(w, 2) :: else -> skip fi }
#endif
    /* Shutdown: release what still runs to queued, fenced, without spending an
     * attempt; resign the lead; exit. */
    :: atomic { ACTIVE(w) && exits > 0 ->
        exits--;
        for (j : 0 .. NJ - 1) {
            if
            :: held[IDX(w, j)] != 0 && !flock[j] -> finish(w, j, held[IDX(w, j)], QUEUED)
            :: else -> skip                /* the write waits out the lock: the rescue has it */
            fi;
            STOP(w, j); obs[IDX(w, j)] = NOBS
        };
        j = 0;
        if :: lholder == w -> lholder = NONE; lttl = 0 :: else -> skip fi;
        done[w] = 0;
        alive[w] = 0 }
    od
}

/* The worker's handlers: an attempt ends, by itself or on its interruption. */
#define END(w, j) \
    :: atomic { ACTIVE(w) && held[IDX(w, j)] != 0 && !flock[j] -> \
        t = held[IDX(w, j)]; \
        if \
        :: intr[IDX(w, j)] != 0 -> out = intr[IDX(w, j)] \
        :: intr[IDX(w, j)] == 0 -> out = SUCCEEDED \
        :: intr[IDX(w, j)] == 0 -> if :: att[j] < MAXATT -> out = RETRYING :: else -> out = FAILED fi \
        :: intr[IDX(w, j)] == 0 && child > 0 -> child--; out = BLOCKED \
        fi; \
        STOP(w, j); \
        finish(w, j, t, out); \
        t = 0; out = 0 }

/* (the handlers run in World, below) */

/* The clock: one tick, once every live and running process has done its rounds and
 * its fence timers have fired. Every clock moves at the same rate. */
#define FENCED_ON_TIME(w, j) !(held[IDX(w, j)] != 0 && age[IDX(w, j)] >= FENCE)
#if NJ == 2
#define TIMERS(w) (FENCED_ON_TIME(w, 0) && FENCED_ON_TIME(w, 1))
#else
#define TIMERS(w) (FENCED_ON_TIME(w, 0) && FENCED_ON_TIME(w, 1) && FENCED_ON_TIME(w, 2))
#endif
#define DONE(w) (!alive[w] || stalled[w] || (done[w] && TIMERS(w)))
#if NW == 2
#define ALLDONE (DONE(0) && DONE(1))
#else
#define ALLDONE (DONE(0) && DONE(1) && DONE(2))
#endif

active proctype Clock() {
    byte w, j;
    /* The scenario: its fault budgets. */
    atomic {
        if
        :: SCENARIOS & S_CRASH -> scenario = S_CRASH; exits = 1; stalls = 1
        :: SCENARIOS & S_CLOCK -> scenario = S_CLOCK; stalls = 1; steps = 1
        :: SCENARIOS & S_NETWORK -> scenario = S_NETWORK; delays = 1; losses = 1
        :: SCENARIOS & S_REQUESTS -> scenario = S_REQUESTS; ops = 1; child = 1; losses = 1
        :: SCENARIOS & S_LOCKS -> scenario = S_LOCKS; flocks = 1
        fi
    }
    /* No end label: the clock never stops, so a state where nothing can move is a
     * deadlock that pan reports (an invalid end state). */
    do
    :: atomic { ALLDONE ->
        for (w : 0 .. NW - 1) {
            done[w] = 0;
            if :: hb[w] && hbage[w] < FENCE -> hbage[w]++ :: else -> skip fi;
            for (j : 0 .. NJ - 1) {
                if :: held[IDX(w, j)] != 0 && age[IDX(w, j)] < FENCE -> age[IDX(w, j)]++
                   :: else -> skip fi;
                /* A running worker's fence timer fires on time (a stopped one's
                 * fires when it resumes, below in Worker, perhaps after its handler ran). */
                if :: ACTIVE(w) && held[IDX(w, j)] != 0 && age[IDX(w, j)] >= FENCE -> STOP(w, j)
                   :: else -> skip fi;
                if :: obs[IDX(w, j)] != NOBS && obs[IDX(w, j)] < L -> obs[IDX(w, j)]++
                   :: else -> skip fi
            }
        };
        if :: lttl > 0 -> lttl-- :: else -> skip fi;
        w = 0; j = 0 }
    od
}

/* The network: a heartbeat reaches the database at any later tick, or is lost on
 * the way; its answer reaches the worker at once, or is lost (an answer that comes
 * late changes nothing a lost one does not: the fence point counts from the send).
 * A worker stopped or dead when its answer comes does not hear it. So with NOTIFY. */
#define NET(w) \
    :: atomic { hb[w] -> \
        heard = ACTIVE(w); \
        for (j : 0 .. NJ - 1) { counted(w, j); beat(w, j, heard) }; \
        hb[w] = 0; heard = 0; j = 0 } \
    :: atomic { hb[w] && ACTIVE(w) && losses > 0 -> losses--; \
        for (j : 0 .. NJ - 1) { counted(w, j); beat(w, j, 0) }; \
        hb[w] = 0; j = 0 } \
    :: atomic { hb[w] && losses > 0 -> losses--; hb[w] = 0; \
        for (j : 0 .. NJ - 1) { hbtok[IDX(w, j)] = 0 }; j = 0 }



/* Faults: SIGKILL, SIGSTOP and SIGCONT, a database clock step, a foreign lock. */
#define FAULTS(w) \
    :: atomic { alive[w] && exits > 0 -> exits--; \
        alive[w] = 0; stalled[w] = 0; done[w] = 0; \
        for (j : 0 .. NJ - 1) { STOP(w, j); obs[IDX(w, j)] = NOBS }; j = 0; \
        skip } \
    :: atomic { alive[w] && !stalled[w] && stalls > 0 -> stalls--; stalled[w] = 1 } \
    :: atomic { stalled[w] -> stalled[w] = 0 }

#define LOCKS(j) \
    :: atomic { !flock[j] && flocks > 0 -> flocks--; flock[j] = 1 } \
    :: atomic { flock[j] -> flock[j] = 0 }



/* A person: cancel (with its record), pause, or retry a failed job. Writes on a row
 * a foreign transaction holds wait until it is released. */
#define PERSON(j) \
    :: atomic { ops > 0 && !flock[j] -> ops--; \
        if \
        :: st[j] == QUEUED || st[j] == BLOCKED || st[j] == RETRYING || st[j] == FAILED -> \
            MOVE(j, CANCELLED) \
        :: st[j] == PAUSED -> MOVE(j, CANCELLED) \
        :: st[j] == PAUSED -> MOVE(j, FAILED)  /* paused over its budget: fails */ \
        :: st[j] == RUNNING && !creq[j] -> creq[j] = 1; crec[j] = PENDING; notif[j] = 1 \
        :: else -> skip \
        fi } \
    :: atomic { ops > 0 && !flock[j] -> ops--; \
        if \
        :: st[j] == QUEUED || st[j] == RETRYING -> MOVE(j, PAUSED) \
        :: st[j] == RUNNING && !creq[j] && !preq[j] -> preq[j] = 1; notif[j] = 1 \
        :: else -> skip \
        fi } \
    :: atomic { ops > 0 && !flock[j] && st[j] == FAILED -> ops--; att[j] = 0; MOVE(j, QUEUED) }



/* What the liveness claims assume of the world: a paused job is resumed (or
 * cancelled) some day, and a parent's children end some day. */
#define LATER(j) \
    :: atomic { st[j] == PAUSED && !flock[j] -> MOVE(j, QUEUED) } \
    :: atomic { st[j] == BLOCKED && !flock[j] -> MOVE(j, QUEUED) }

/* The world around the workers, one process: the handlers, the network, faults, a
 * person, and what the liveness claims assume (a paused job is resumed some day, a
 * parent's children end some day). One process keeps weak fairness cheap: every
 * action here is bounded (a budget, or a job's attempts), so a fair run takes every
 * one that stays enabled. */
active proctype World() {
    byte j, t, out;
    bool heard;
end:
    do
    /* the handlers of worker 0 */
    END(0, 0)
    END(0, 1)
#if NJ > 2
    END(0, 2)
#endif
#if NW > 1
    /* the handlers of worker 1 */
    END(1, 0)
    END(1, 1)
#if NJ > 2
    END(1, 2)
#endif
#endif
#if NW > 2
    END(2, 0)
    END(2, 1)
#if NJ > 2
    END(2, 2)
#endif
#endif
    /* the network */
    NET(0)
    NET(1)
#if NW > 2
    NET(2)
#endif
    :: atomic { losses > 0 && notif[0] -> losses--; notif[0] = 0 }
    :: atomic { losses > 0 && notif[1] -> losses--; notif[1] = 0 }
#if NJ > 2
    :: atomic { losses > 0 && notif[2] -> losses--; notif[2] = 0 }
#endif
    /* faults */
    FAULTS(0)
    FAULTS(1)
#if NW > 2
    FAULTS(2)
#endif
    LOCKS(0)
    LOCKS(1)
#if NJ > 2
    LOCKS(2)
#endif
    :: atomic { steps > 0 -> steps--;
        for (j : 0 .. NJ - 1) { if :: st[j] == RUNNING -> jumped[j] = 1 :: else -> skip fi }; j = 0;
        lttl = 0 }
    /* a person */
    PERSON(0)
    PERSON(1)
#if NJ > 2
    PERSON(2)
#endif
    /* later */
    LATER(0)
    LATER(1)
#if NJ > 2
    LATER(2)
#endif
    od
}

#ifndef NOMONITOR
active proctype Monitor() {
    atomic { !SAFE -> assert(SAFE) }
}
#endif

/* ---------------------------------------------------------------- liveness */
#define ENDED(j) (st[j] == SUCCEEDED || st[j] == FAILED || st[j] == CANCELLED)
#if NJ == 2
#define ALLENDED (ENDED(0) && ENDED(1))
#define NONEPENDING (crec[0] != PENDING && crec[1] != PENDING)
#else
#define ALLENDED (ENDED(0) && ENDED(1) && ENDED(2))
#define NONEPENDING (crec[0] != PENDING && crec[1] != PENDING && crec[2] != PENDING)
#endif

ltl every_job_ends { [] <> ALLENDED }
ltl every_cancellation_settles { [] (!NONEPENDING -> <> NONEPENDING) }
