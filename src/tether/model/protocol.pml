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
#define NOBS     255    /* the rescuer is not watching this worker */
#define IDX(w, j) ((w) * NJ + (j))
#define WIDX(r, o) ((r) * NW + (o))
#define ALLW     ((1 << NW) - 1)
#define ALLJ     ((1 << NJ) - 1)

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
byte lage[NJ];          /* ticks, by the database clock, since lease_expires_at was set
                           (claim, or a heartbeat that extended it), up to L */
byte older[NJ];         /* counted beats of its worker that landed after the job's
                           heartbeat_at (claim or extension), up to 2: at 2, the job's
                           heartbeat_at is older than the worker's beat_before */
bool flock[NJ];         /* a foreign transaction holds the row */
/* tether_workers */
bool wlock[NW];         /* a foreign transaction holds the worker's row */
byte bchg[NW];          /* bit r: beats moved since rescuer r last read it */
byte hold[NW] = ALLJ;   /* holding of the last counted beat, bit j (ALLJ: NULL, no beat yet) */
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
byte wobs[NW * NW] = NOBS; /* BeatWatch of worker r on worker o (WIDX(r, o)): ticks, by r's
                           monotonic clock, since r first saw o's current beats (NOBS: none) */
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
byte flocks;            /* foreign transactions holding rows (job rows, worker rows) */
bool foreign;           /* that transaction is open */
byte ops;               /* a person's cancel / pause / retry */
byte child;             /* a job that waits for its children */
byte parks;             /* a handler's sleep or wait for a signal, which parks its job */

/* ---------------------------------------------------------------- the protocol */

/* The state machine: every state change goes through MOVE, which refuses any
 * transition that states.py does not list (the transition trigger's job). */
#define MOVE(j, to) assert(LEGAL(st[j], to)); st[j] = to

/* A job leaves running: its lease and its requests go with it. */
#define LEAVE(j, to) \
    MOVE(j, to); own[j] = NONE; jumped[j] = 0; creq[j] = 0; preq[j] = 0; \
    notif[j] = 0; lage[j] = 0; older[j] = 0

/* Fencing: every worker write matches id, lease_token and state = 'running'. */
#define FENCED(j, t) (tok[j] == (t) && st[j] == RUNNING)

/* An accepted worker write comes from the job's latest attempt: no stale token. */
#define ACCEPTED(j, t) assert((t) == tok[j])

/* Design switches (README.md, "Mutants"); the protocol checked has them as below.
 * SKIPPED_RENEWS: a heartbeat's answer renews the fence point of a row it skipped;
 * UNCOUNTED_FENCES: a beat that did not reach the worker's row renews every fence point;
 * HOLDING: the rescue takes a job its live worker dropped (holding, beat_before). */
#ifndef SKIPPED_RENEWS
#define SKIPPED_RENEWS 0
#endif
#ifndef UNCOUNTED_FENCES
#define UNCOUNTED_FENCES 0
#endif
#ifndef HOLDING
#define HOLDING 1
#endif
/* STALE_BEATS: the heartbeater abandons a call that timed out, as Heartbeater.run_once
 * does, instead of waiting for it; the abandoned beat may still land after later ones
 * (README.md, "One beat in flight"). Not in the checks `make test` runs. */
#ifndef STALE_BEATS
#define STALE_BEATS 0
#endif
#if STALE_BEATS
bool sb[NW];            /* an abandoned heartbeat is still on its way */
bool nb[NW];            /* a later beat of the worker landed on its row since */
byte stok[NW * NJ];     /* the tokens it carries */
#endif

/* The rescue of a running job whose worker is not known dead (RESCUE): its lease
 * expired by the database clock (EXPIRED: L ticks since it was set, or the clock
 * stepped past it), AND either its worker is quiet (QUIET: rescuer r's BeatWatch saw
 * the worker's beats stand still for L ticks of r's monotonic clock; the statement
 * re-checks the count under FOR SHARE of the worker's row, which the model's atomic
 * pass gives), or its worker dropped it (DROPPED: the worker's last counted beat did
 * not list it in holding, and the job's heartbeat_at is older than beat_before). */
#define EXPIRED(j)      (jumped[j] || lage[j] >= L)
#define QUIET(r, o)     (wobs[WIDX(r, o)] != NOBS && wobs[WIDX(r, o)] >= L)
#define DROPPED(o, j)   (HOLDING && !(hold[o] & (1 << (j))) && older[j] >= 2)
#define STALE(r, j) (EXPIRED(j) && (QUIET(r, own[j]) || DROPPED(own[j], j)))

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
        tok[j] = tok[j] + 1; own[j] = w; jumped[j] = 0; lage[j] = 0; older[j] = 0;
        if :: att[j] < MAXATT -> att[j] = att[j] + 1 :: else -> skip fi;
        held[IDX(w, j)] = tok[j]; age[IDX(w, j)] = 0; intr[IDX(w, j)] = 0
    :: else -> skip
    fi
}

/* BeatWatch.observe (every live worker, leader or not, each round): a worker whose
 * beats moved is first seen now; a worker not listed (dead, stopped) is forgotten. */
inline observe(r, o) {
    if
    :: alive[o] && (bchg[o] & (1 << r)) -> bchg[o] = bchg[o] & ~(1 << r); wobs[WIDX(r, o)] = 0
    :: alive[o] && !(bchg[o] & (1 << r)) && wobs[WIDX(r, o)] == NOBS -> wobs[WIDX(r, o)] = 0
    :: alive[o] && !(bchg[o] & (1 << r)) && wobs[WIDX(r, o)] != NOBS -> skip
    :: !alive[o] -> wobs[WIDX(r, o)] = NOBS
    fi
}

/* The rescuer's pass over one job (maintenance/rescuer.py, store RESCUE), after
 * observe: job rows FOR NO KEY UPDATE SKIP LOCKED. */
inline rescue_pass(r, j) {
    if
    :: st[j] == RUNNING && !flock[j] && (!alive[own[j]] || STALE(r, j)) -> rescue(j)
    :: else -> skip                        /* SKIP LOCKED, or not due */
    fi
}

/* The follow-up settles a record once its job no longer runs, whoever died. */
#define FOLLOW_UP(j) if :: crec[j] == PENDING && st[j] != RUNNING -> crec[j] = SETTLED :: else -> skip fi

/* A request reaches the worker (NOTIFY, or the heartbeat's answer): it interrupts
 * the attempt, which then ends with that outcome (the handler writes it). On the
 * heartbeat's path the worker reads the request's reason first (a read, no write):
 * that is this HEAR one step later, as a delayed answer is, and a job that left its
 * worker meanwhile is not interrupted (intr is only read while the worker holds it). */
#define HEAR(w, j) \
    if :: creq[j] -> intr[IDX(w, j)] = CANCELLED \
       :: !creq[j] && preq[j] -> intr[IDX(w, j)] = PAUSED \
       :: else -> skip fi

#define ACTIVE(w) (alive[w] && !stalled[w])

/* One job of a heartbeat that reaches the database: matched by its token (zero rows:
 * the lease is lost). A row a foreign transaction holds is skipped (SKIP LOCKED): not
 * extended, and reported held (still ours) if its token and state still match, else
 * lost. If `heard`, the answer reaches the worker: an extended job's fence point moves
 * to the SEND, a lost one stops, and the pending requests are heard. */
inline beat(w, j, heard) {
    if
    :: hbtok[IDX(w, j)] == 0 -> skip
    :: hbtok[IDX(w, j)] != 0 && flock[j] && FENCED(j, hbtok[IDX(w, j)]) ->
        if
        :: heard && held[IDX(w, j)] == hbtok[IDX(w, j)] ->
            if :: SKIPPED_RENEWS && hbage[w] < age[IDX(w, j)] -> age[IDX(w, j)] = hbage[w]
               :: else -> skip fi;
            if :: intr[IDX(w, j)] == 0 -> HEAR(w, j) :: else -> skip fi
        :: else -> skip
        fi
    :: hbtok[IDX(w, j)] != 0 && !flock[j] && FENCED(j, hbtok[IDX(w, j)]) ->
        ACCEPTED(j, hbtok[IDX(w, j)]);
        jumped[j] = 0; lage[j] = 0; older[j] = 0;
        if
        :: heard && held[IDX(w, j)] == hbtok[IDX(w, j)] ->
            if :: hbage[w] < age[IDX(w, j)] -> age[IDX(w, j)] = hbage[w] :: else -> skip fi;
            if :: intr[IDX(w, j)] == 0 -> HEAR(w, j) :: else -> skip fi
        :: else -> skip
        fi
    :: hbtok[IDX(w, j)] != 0 && !FENCED(j, hbtok[IDX(w, j)]) ->
        if
        :: heard && held[IDX(w, j)] == hbtok[IDX(w, j)] -> STOP(w, j)  /* lease lost */
        :: else -> skip
        fi
    fi;
    hbtok[IDX(w, j)] = 0
}

/* The whole heartbeat statement (HEARTBEAT), then its answer. The worker's row first
 * (FOR NO KEY UPDATE SKIP LOCKED): if free, the beat is counted: beats + 1, holding,
 * beat_before = the previous heartbeat_at (every running job of the worker that this
 * statement does not extend is now one counted beat older). Then the job rows. A
 * counted beat, heard, moves every fence point of the worker to the send (last_ok). */
inline land(w, heard) {
    cnt = !wlock[w];
    if
    :: cnt ->
#if STALE_BEATS
        nb[w] = sb[w];
#endif
        bchg[w] = ALLW; hold[w] = 0;
        for (j : 0 .. NJ - 1) {
            /* holding: the jobs the worker ran at the send (the tokens the beat carries) */
            if :: hbtok[IDX(w, j)] != 0 -> hold[w] = hold[w] | (1 << j) :: else -> skip fi;
            /* While holding lists the job, 1 and 2 are one state: the next counted beat
             * that leaves it out makes either 2. */
            if :: st[j] == RUNNING && own[j] == w && older[j] < 2 && hbtok[IDX(w, j)] == 0 ->
                  older[j]++
               :: st[j] == RUNNING && own[j] == w && hbtok[IDX(w, j)] != 0 -> older[j] = 1
               :: else -> skip fi
        }
    :: else -> skip
    fi;
    for (j : 0 .. NJ - 1) { beat(w, j, heard) };
    if
    :: heard && (cnt || UNCOUNTED_FENCES) ->
        for (j : 0 .. NJ - 1) {
            if :: held[IDX(w, j)] != 0 && hbage[w] < age[IDX(w, j)] -> age[IDX(w, j)] = hbage[w]
               :: else -> skip fi
        }
    :: else -> skip
    fi;
    j = 0; cnt = 0
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

/* A worker that exits: its watches go (its own, and everyone's on it: a dead or
 * stopped worker is no longer listed), and its counter's news with them. */
#define FORGET(w) \
    for (j : 0 .. NW - 1) { wobs[WIDX(w, j)] = NOBS; wobs[WIDX(j, w)] = NOBS }; \
    for (j : 0 .. NJ - 1) { \
        if :: own[j] == w -> lage[j] = 0; older[j] = 0; jumped[j] = 0 :: else -> skip fi }; \
    bchg[w] = 0; hold[w] = ALLJ; j = 0

/* ---------------------------------------------------------------- processes */

/* One worker process: its heartbeater and claimer, its maintenance services (leader
 * election, rescuer, follow-up), its listener, its self-fencing, and shutdown. */
active [NW] proctype Worker() {
    byte w = _pid;      /* the workers are the first processes: pids 0 .. NW - 1 */
    byte j, o;
    bool lead, cnt;
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
        /* Every worker reads the beat counters (Rescuer.observe, or off_duty when not
         * leading); the leader's duties: rescue, then settle the cancellation records. */
        for (o : 0 .. NW - 1) { observe(w, o) };
        o = 0;
        if
        :: lead ->
            for (j : 0 .. NJ - 1) { rescue_pass(w, j) };
            for (j : 0 .. NJ - 1) { FOLLOW_UP(j) }
        :: else -> skip
        fi;
        /* Heartbeater: one write per interval. A call still unanswered has timed
         * out; it may yet reach the database, and the next round waits for it. */
#if STALE_BEATS
        if
        :: hb[w] && !sb[w] ->               /* abandoned: the round goes on */
            for (j : 0 .. NJ - 1) { stok[IDX(w, j)] = hbtok[IDX(w, j)]; hbtok[IDX(w, j)] = 0 };
            sb[w] = 1; hb[w] = 0
        :: else -> skip
        fi;
#endif
        if
        :: !hb[w] ->
            for (j : 0 .. NJ - 1) { hbtok[IDX(w, j)] = held[IDX(w, j)] };
            hbage[w] = 0;
            if
            :: land(w, 1)                  /* answered in time */
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
            STOP(w, j)
        };
        FORGET(w);
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
        :: intr[IDX(w, j)] == 0 && parks > 0 -> parks--; out = QUEUED \
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
        :: SCENARIOS & S_REQUESTS -> scenario = S_REQUESTS; ops = 1; child = 1; parks = 1;
            losses = 1
        :: SCENARIOS & S_LOCKS -> scenario = S_LOCKS; flocks = 1; delays = STALE_BEATS
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
                /* (a dead worker's job is rescued whatever its lease says) */
                if :: w == 0 && st[j] == RUNNING && alive[own[j]] && lage[j] < L -> lage[j]++
                   :: else -> skip fi
            };
            for (j : 0 .. NW - 1) {
                if :: wobs[WIDX(w, j)] != NOBS && wobs[WIDX(w, j)] < L -> wobs[WIDX(w, j)]++
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
        land(w, heard); \
        hb[w] = 0; heard = 0 } \
    :: atomic { hb[w] && ACTIVE(w) && losses > 0 -> losses--; \
        land(w, 0); \
        hb[w] = 0 } \
    :: atomic { hb[w] && losses > 0 -> losses--; hb[w] = 0; \
        for (j : 0 .. NJ - 1) { hbtok[IDX(w, j)] = 0 }; j = 0 }



#if STALE_BEATS
/* An abandoned beat lands (nobody hears its answer), or is lost. */
#define ABANDONED(w) \
    :: atomic { sb[w] -> \
        /* STALE_BEATS == 2: a beat older than one already counted leaves the \
         * worker's row alone (a sequence number on the row would do it) */ \
        cnt = !wlock[w] && !(STALE_BEATS == 2 && nb[w]); \
        if \
        :: cnt -> \
            bchg[w] = ALLW; hold[w] = 0; \
            for (j : 0 .. NJ - 1) { \
                if :: stok[IDX(w, j)] != 0 -> hold[w] = hold[w] | (1 << j) :: else -> skip fi; \
                if :: st[j] == RUNNING && own[j] == w && older[j] < 2 && stok[IDX(w, j)] == 0 -> \
                      older[j]++ \
                   :: st[j] == RUNNING && own[j] == w && stok[IDX(w, j)] != 0 -> older[j] = 1 \
                   :: else -> skip fi \
            } \
        :: else -> skip \
        fi; \
        for (j : 0 .. NJ - 1) { \
            if \
            :: stok[IDX(w, j)] != 0 && !flock[j] && FENCED(j, stok[IDX(w, j)]) -> \
                jumped[j] = 0; lage[j] = 0; older[j] = 0 \
            :: else -> skip \
            fi; \
            stok[IDX(w, j)] = 0 \
        }; \
        sb[w] = 0; nb[w] = 0; cnt = 0; j = 0 } \
    :: atomic { sb[w] && losses > 0 -> losses--; sb[w] = 0; nb[w] = 0; \
        for (j : 0 .. NJ - 1) { stok[IDX(w, j)] = 0 }; j = 0 }
#else
#define ABANDONED(w)
#endif

/* Faults: SIGKILL, SIGSTOP and SIGCONT, a database clock step, a foreign lock. */
#define FAULTS(w) \
    :: atomic { alive[w] && exits > 0 -> exits--; \
        alive[w] = 0; stalled[w] = 0; done[w] = 0; \
        for (j : 0 .. NJ - 1) { STOP(w, j) }; j = 0; \
        FORGET(w) } \
    :: atomic { alive[w] && !stalled[w] && stalls > 0 -> stalls--; stalled[w] = 1 } \
    :: atomic { stalled[w] -> stalled[w] = 0 }

/* A foreign transaction takes row locks (FOR UPDATE), at once, and holds them until
 * it ends: a job row, a worker's row, or one of each. */
#define LOCK1(v, n) \
    if \
    :: v[0] = 1 \
    :: n > 1 -> v[1] = 1 \
    :: n > 2 -> v[n - 1] = 1 \
    :: skip \
    fi



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
    bool heard, cnt;
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
    ABANDONED(0)
    ABANDONED(1)
#if NW > 2
    ABANDONED(2)
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
    :: atomic { flocks > 0 -> flocks--; foreign = 1;
        LOCK1(flock, NJ); LOCK1(wlock, NW) }
    :: atomic { foreign -> foreign = 0;
        for (j : 0 .. NJ - 1) { flock[j] = 0 };
        for (j : 0 .. NW - 1) { wlock[j] = 0 };
        j = 0 }
    :: atomic { steps > 0 -> steps--;
        for (j : 0 .. NJ - 1) {
            if :: st[j] == RUNNING && alive[own[j]] -> jumped[j] = 1 :: else -> skip fi }; j = 0;
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
