"""The README's example as a script that runs as written: ``python examples/quickstart.py``.

A worker runs in this process (``app.run_until_idle()``); in production, run
``tether worker --app quickstart:app`` instead.
"""

import asyncio

import tether

app = tether.App()  # $TETHER_DATABASE_URL, else sqlite:///tether.db


@app.task(max_attempts=3, timeout=60)
async def crawl(ctx: tether.JobContext, url: str) -> int:
    done = (ctx.checkpoint or {}).get("pages", 0)  # resume where the last attempt stopped
    for page in range(done, 10):
        ctx.check_cancelled()  # a cancellation point
        await asyncio.sleep(0.01)  # fetch the page
        await ctx.save_checkpoint({"pages": page + 1})
        ctx.set_progress(page + 1, 10)
    return 10


async def main() -> None:
    job = await crawl.enqueue(url="https://example.org")
    [done] = await app.run_until_idle()  # every due job, in this process
    print(f"job {job.id} {done.state.value}: crawled {done.result} pages")
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
