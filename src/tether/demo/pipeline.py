"""The demo's app and its tasks: crawl → chunk → embed → upsert, and a digest workflow.

The web is simulated, deterministically, so every run tells the same story:

- ``flaky`` hosts reset the connection halfway through the first attempt; the retry
  resumes from the last page checkpointed;
- embedding ``docs.example.org`` and ``research.example.edu`` runs out of (simulated)
  GPU memory on the first attempt;
- ``.invalid`` hosts never resolve, so that crawl fails for good after its attempts;
- ``example.org/archive`` is long: the demo cancels it while it runs.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from urllib.parse import urlsplit

from tether.app import App
from tether.config import RetryPolicy
from tether.context import JobContext, SyncJobContext
from tether.errors import WaitForChildren
from tether.job import JSON

DEMO_DATABASE_URL = "sqlite:///.tether/demo.db"
"""Relative to the current directory; ``tether demo`` recreates it on every run."""

app = App(DEMO_DATABASE_URL)
"""The demo's app: ``tether worker --app tether.demo:app`` runs its tasks."""

# Short backoff so retries happen while you watch.
DEMO_RETRY = RetryPolicy(base_delay=1.0, factor=2.0, max_delay=5.0, jitter=0.1)

SITES: list[tuple[str, int]] = [
    ("https://example.org/archive", 60),
    ("https://example.org/blog", 6),
    ("https://docs.example.org/guide", 8),
    ("https://flaky.example.net/wiki", 7),
    ("https://news.example.com/today", 5),
    ("https://gone.example.invalid/", 4),
    ("https://shop.example.com/catalog", 4),
    ("https://research.example.edu/papers", 9),
    ("https://flaky.example.net/forum", 6),
    ("https://example.com/changelog", 5),
    ("https://status.example.org/", 3),
    ("https://example.net/faq", 5),
]
"""The sample crawls: ``(url, pages)``. The first eight are enqueued at once."""

MORE_SITES = [
    "https://example.org/post-{n}",
    "https://blog.example.com/p/{n}",
    "https://flaky.example.net/thread-{n}",
    "https://example.com/news/{n}",
]
"""After the samples, a new crawl of one of these arrives every few seconds."""
FLAKY_EMBED = {"https://docs.example.org/guide", "https://research.example.edu/papers"}
WORDS_PER_CHUNK = 400


def site_pages(url: str) -> int:
    """How many pages the simulated site at ``url`` has (3 to 10 when not listed)."""
    for known, pages in SITES:
        if known == url:
            return pages
    return 3 + zlib.crc32(url.encode()) % 8


def page_words(url: str, page: int) -> int:
    """The simulated word count of one page."""
    return 300 + zlib.crc32(f"{url}#{page}".encode()) % 900


@app.task(name="crawl", max_attempts=3, retry=DEMO_RETRY)
async def crawl(ctx: JobContext, url: str, pages: int | None = None) -> dict[str, JSON]:
    """Fetch every page of a site, checkpointing after each so a retry resumes there."""
    total = pages or site_pages(url)
    host = urlsplit(url).hostname or url
    # The checkpoint is what the previous attempt saved: start where it stopped.
    state: dict[str, int] = ctx.checkpoint or {"next_page": 0, "pages": total, "words": 0}
    ctx.set_progress(state["next_page"], total)
    if host.endswith(".invalid"):
        await asyncio.sleep(0.3)
        raise ConnectionError(f"cannot resolve host {host!r}")
    for page in range(state["next_page"], total):
        # Between pages is a safe place to stop: everything before is checkpointed.
        ctx.check_cancelled()
        await asyncio.sleep(random.uniform(0.15, 0.4))  # the "fetch"
        if "flaky" in host and ctx.attempt == 1 and page == total // 2:
            raise ConnectionResetError(f"{host}: connection reset by peer on page {page + 1}")
        words = state["words"] + page_words(url, page)
        state = {"next_page": page + 1, "pages": total, "words": words}
        await ctx.save_checkpoint(state)
        ctx.set_progress(page + 1, total)
    # The idempotency key makes the hand-off happen once even if this attempt dies
    # between enqueueing and finishing, and the next attempt enqueues again.
    await chunk.options(priority=1, idempotency_key=f"chunk-of-{ctx.id}").enqueue(
        url=url, words=state["words"]
    )
    return {"pages": total, "words": state["words"]}


@app.task(name="chunk", retry=DEMO_RETRY)
async def chunk(ctx: JobContext, url: str, words: int) -> dict[str, JSON]:
    """Split a crawled site into chunks of about 400 words."""
    await asyncio.sleep(random.uniform(0.2, 0.5))
    chunks = max(1, words // WORDS_PER_CHUNK)
    ctx.set_progress(chunks, chunks)
    await embed.options(priority=2, idempotency_key=f"embed-of-{ctx.id}").enqueue(
        url=url, chunks=chunks
    )
    return {"chunks": chunks}


@app.task(name="embed", retry=DEMO_RETRY)
def embed(ctx: SyncJobContext, url: str, chunks: int) -> dict[str, JSON]:
    """Embed each chunk (a plain ``def``: it runs in a thread and stops cooperatively)."""
    for i in range(chunks):
        # A thread cannot be interrupted, so it asks: waiting on the signal instead of
        # sleeping makes it stop at once when a cancel (or shutdown) arrives.
        if ctx.cancelled.wait_sync(random.uniform(0.08, 0.16)):
            ctx.check_cancelled()
        if url in FLAKY_EMBED and ctx.attempt == 1 and i == chunks // 2:
            raise MemoryError("CUDA out of memory (simulated) while embedding")
        ctx.set_progress(i + 1, chunks)
    # Sync code enqueues with the blocking API.
    upsert.options(priority=3, idempotency_key=f"upsert-of-{ctx.id}").enqueue_sync(
        url=url, vectors=chunks
    )
    return {"vectors": chunks, "dim": 384}


@app.task(name="upsert", retry=DEMO_RETRY)
async def upsert(ctx: JobContext, url: str, vectors: int) -> dict[str, JSON]:
    """Write the vectors to the (simulated) index."""
    await asyncio.sleep(random.uniform(0.1, 0.3))
    ctx.set_progress(vectors, vectors)
    return {"indexed": vectors}


@app.task(name="summarize", retry=DEMO_RETRY)
async def summarize(ctx: JobContext, section: str, steps: int = 6) -> dict[str, JSON]:
    """A child of ``digest``: summarize one section, checkpointing each step."""
    state: dict[str, int] = ctx.checkpoint or {"step": 0}
    for step in range(state["step"], steps):
        ctx.check_cancelled()
        await asyncio.sleep(random.uniform(0.3, 0.6))
        await ctx.save_checkpoint({"step": step + 1})
        ctx.set_progress(step + 1, steps)
    return {"section": section, "sentences": 3 + zlib.crc32(section.encode()) % 5}


@app.task(name="digest", retry=DEMO_RETRY)
async def digest(ctx: JobContext, sections: list[str]) -> dict[str, JSON]:
    """A parent: spawn a summary per section, wait for them without holding a worker,
    then add them up. It depends on two crawls (a workflow)."""
    if ctx.phase is None:
        for section in sections:
            await ctx.spawn(summarize, section=section)
        raise WaitForChildren("combine")
    kids = await ctx.children()
    done = [k for k in kids if k.state.value == "succeeded"]
    return {
        "sections": len(done),
        "sentences": sum(int((k.result or {}).get("sentences", 0)) for k in done),
    }
