"""Feed benchmark: fan-out to 5,000 followers against the store's own speed, and the
first timeline pages of a pushed reader and of one following pulled authors.

    .venv/bin/python -m bench.feed_bench [--quick]

1. Fan-out (node A, default IM_FEED_PUSH_MAX): ``--followers`` follow the author
   (HTTP, 50 at a time, untimed). ``--warmup-posts`` + ``--posts`` posts one at a time:
   POST = request -> response; all timelines = request -> ``posts.fanout == "done"``
   (``find_one`` every ``--poll-ms``), then its ``timelines`` entries are counted.
2. Raw store, no node running: per 1,000 followers what a fan-out does - read the
   ``fans`` page, ``insert_many`` 1,000 timeline docs (ordered=False, w=majority,
   j=true, the node's index, scratch database), a Redis pipeline of 1,000 HINCRBY.
3. Timeline reads, ``--repeat`` x (page 1 of 50, page 2 by its cursor), each page
   compared with the expected ids. (a) a follower who also follows ``--fill`` one-post
   authors; (b) node B (IM_FEED_PUSH_MAX=``--pull-max``): a reader of ``--authors``
   x ``--author-posts`` posts, ``--big`` authors pulled (``--big-followers`` each).
   Reads start when no fan-out is pending (steady state). Each store call of the read is then
   replayed alone (20 x). Markdown on stdout, JSON in bench/out/feed-<stamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import redis.asyncio as aioredis

from bench import cli, common
from bench.cluster import Run
from bench.report import fmt, header_lines, lat, md_table, node_lines
from bench.stats import latency_summary
from gateway.feed.fanout import FANOUT_CHUNK
from store.counters_redis import CountersRedis
from store.feed_mongo import FEED_INDEXES, tl_id
from store.feed_redis import FeedCacheRedis
from store.follows_mongo import FollowsMongo
from store.keys import Keys
from store.mongo_client import connect_mongo
from store.posts_mongo import PostsMongo
from store.timeline_mongo import TimelineMongo
from testkit.http import HttpUsers
from testkit.nodes import NodeProcess
from testkit.poll import bounded

SEED_002_S = 16.3  # the PostgreSQL baseline: average time until 5,000 timelines have a post
CONCURRENCY = 50
LIMIT = 50
SERVICES = ("secantusd", "redis-server", "beam.smp", "epmd", "mongod", "nats-server")
log = functools.partial(common.say, "feed_bench")
summary = functools.partial(latency_summary, mean=True)


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


class Http:
    """The node's HTTP API as any user (``testkit.http``), timed; a request that fails
    in transport is retried (counted and reported; its time is not)."""

    def __init__(self, base_url: str, secret: str) -> None:
        # Idle connections are dropped before uvicorn's 5 s keep-alive closes them (a
        # request racing that close fails with ReadError).
        self.users = HttpUsers(base_url, secret, limits=httpx.Limits(
            max_connections=CONCURRENCY, keepalive_expiry=2))
        self.retries = 0

    async def call(self, method: str, user: str, path: str, body: Any = None
                   ) -> tuple[float, Any]:
        """(seconds, decoded answer); HttpError unless 200."""
        for _ in range(2):
            try:
                return await common.timed(self.users[user].ok(method, path, json=body))
            except httpx.TransportError as exc:
                self.retries += 1
                log(f"{method} {path}: {type(exc).__name__} {exc}; retrying")
        return await common.timed(self.users[user].ok(method, path, json=body))

    async def post(self, user: str, text: str) -> tuple[float, int]:
        took, body = await self.call("POST", user, "/v1/posts", {"text": text})
        return took, int(body["post"]["id"])


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.run = args, Run(args, "feed")
        self.ns_a, self.ns_b = self.run.namespace("a"), self.run.namespace("b")
        self.raw_db = self.run.base + "raw"
        self.mongo = connect_mongo(args.mongo_url, 60)
        self.redis = aioredis.Redis.from_url(args.redis_url, socket_timeout=30)
        self.names = {os.getpid(): "feed_bench (this process)"}
        self.nodes: list[NodeProcess] = []
        self.https: list[Http] = []
        self.cpu: list[dict[str, Any]] = []  # per phase

    async def start_node(self, ns: str, label: str, **settings: Any) -> Http:
        self.nodes += await self.run.start_nodes(ns, 1, label, **settings)
        self.names[self.nodes[-1].pid] = f"gateway node {label}"
        self.https.append(Http(self.nodes[-1].http_url, self.run.secret))
        return self.https[-1]

    async def phase(self, name: str, job: Awaitable[Any], budget: float) -> Any:
        """Run ``job`` within ``budget`` seconds; note its wall time and CPU."""
        log(f"{name} ...")
        meter = common.Meter(self.names, top=12)
        async with asyncio.timeout(budget):
            out = await job
        seconds, cpu = meter.stop()
        others = [p for p in cpu["top"] if str(p["pid"]) not in cpu["by_pid"]
                  and not any(s in p["what"] for s in SERVICES)]
        self.cpu.append({"phase": name, "seconds": round(seconds, 2), **cpu,
                         "other_cores": round(sum(p["cores"] for p in others), 2),
                         "other_top": others[:3]})
        log(f"{name}: {seconds:.1f} s")
        return out

    async def follow(self, http: Http, pairs: list[tuple[str, str]]) -> float:
        t = time.perf_counter()
        await bounded((http.call("POST", u, f"/v1/follow/{o}") for u, o in pairs), CONCURRENCY)
        return round(time.perf_counter() - t, 2)

    async def settled(self, ns: str, timeout: float = 600) -> None:
        """No post of ``ns`` has a pending fan-out (then 1 s more)."""
        async with asyncio.timeout(timeout):
            while True:
                if not await self.mongo[ns]["posts"].count_documents({"fanout": "pending"}):
                    break
                await asyncio.sleep(0.1)
        await asyncio.sleep(1)

    # -- 1. fan-out ---------------------------------------------------------------------
    async def fanout_setup(self, http: Http) -> dict[str, Any]:
        fans = [f"f{i:05d}" for i in range(self.args.followers)]
        fill = [f"s{i:04d}" for i in range(self.args.fill)]
        follow_s = await self.follow(http, [(f, "au") for f in fans] + [(fans[0], s)
                                                                       for s in fill])
        _, prof = await http.call("GET", fans[0], "/v1/users/au")
        self.fill_posts = [p for _, p in await bounded(
            (http.post(s, f"fill post of {s}") for s in fill), 10)]
        await self.settled(self.ns_a)
        return {"follows": len(fans) + len(fill), "follow_s": follow_s,
                "follows_per_s": round((len(fans) + len(fill)) / follow_s, 1),
                "author_followers": prof["followers"], "fill_posts": len(self.fill_posts)}

    async def fanout_measure(self, http: Http) -> dict[str, Any]:
        a, db = self.args, self.mongo[self.ns_a]
        rows: list[dict[str, Any]] = []
        self.main_posts: list[int] = []
        for i in range(a.warmup_posts + a.posts):
            t0, polls = time.perf_counter(), 0
            post_s, post = await http.post("au", f"post {i} to {a.followers} followers")
            async with asyncio.timeout(300):
                while True:
                    polls += 1
                    doc = await db.posts.find_one({"_id": post}, {"fanout": 1})
                    if doc and doc.get("fanout") == "done":
                        break
                    await asyncio.sleep(a.poll_ms / 1000)
            done_s = time.perf_counter() - t0
            have = await db.timelines.count_documents({"p": post})  # ({_id: {$in}}: 12 s)
            self.main_posts.append(post)
            rows.append({"post": post, "warmup": i < a.warmup_posts, "post_ms": ms(post_s),
                         "all_timelines_ms": ms(done_s), "polls": polls, "entries": have})
            log(f"post {i}: POST {post_s * 1000:.0f} ms, all timelines {done_s:.2f} s, "
                f"{have}/{a.followers + 1} entries")
            await asyncio.sleep(0.2)
        measured = [r for r in rows if not r["warmup"]]
        done = [r["all_timelines_ms"] / 1000 for r in measured]
        return {"posts": rows, "post": summary([r["post_ms"] / 1000 for r in measured]),
                "all_timelines": summary(done), "expected_entries": a.followers + 1,
                "complete": all(r["entries"] == a.followers + 1 for r in rows),
                "speedup_vs_seed_002": round(SEED_002_S / statistics.fmean(done), 1)}

    # -- 2. raw store -----------------------------------------------------------------
    async def raw_store(self) -> dict[str, Any]:
        coll, fans = self.mongo[self.raw_db]["timelines"], FollowsMongo(self.mongo[self.ns_a])
        for collection, keys, options in FEED_INDEXES:
            if collection == "timelines":
                await coll.create_index(keys, **options)
        scratch, reps = f"{self.ns_a}:benchscratch", []
        for rep in range(self.args.raw_reps):
            post, after, t = 1 << 50 | rep, None, {"fans_read": 0.0, "insert": 0.0, "redis": 0.0}
            while True:
                s = time.perf_counter()
                chunk = await fans.page_ids("followers", "au", after, FANOUT_CHUNK)
                t["fans_read"] += time.perf_counter() - s
                if not chunk:
                    break
                after, pipe = chunk[-1], self.redis.pipeline(transaction=False)
                for u in chunk:
                    pipe.hincrby(scratch, u, 1)
                docs = [{"_id": tl_id(u, post), "u": u, "p": post, "a": "au"} for u in chunk]
                t["insert"] += (await common.timed(coll.insert_many(docs, ordered=False)))[0]
                t["redis"] += (await common.timed(pipe.execute()))[0]
            reps.append(t)
        await self.mongo.drop_database(self.raw_db)
        await self.redis.delete(scratch)
        out = {k: summary([r[k] for r in reps]) for k in ("fans_read", "insert", "redis")}
        return {**out, "total": summary([sum(r.values()) for r in reps]),
                "docs": self.args.followers, "docs_per_s": round(
                    self.args.followers * len(reps) / sum(r["insert"] for r in reps), 1)}

    # -- 3. timeline reads -------------------------------------------------------------
    async def reads(self, http: Http, ns: str, user: str, expected: list[int],
                    marked: set[int]) -> dict[str, Any]:
        exp = sorted(expected, reverse=True)
        pages, path = (exp[:LIMIT], exp[LIMIT:2 * LIMIT]), f"/v1/timeline?limit={LIMIT}"
        cold, _ = await http.call("GET", user, path)
        for _ in range(5):
            await http.call("GET", user, path)
        times: tuple[list[float], list[float]] = ([], [])
        bad: list[str] = []
        for _ in range(self.args.repeat):
            cursor = None
            for k in (0, 1):
                took, body = await http.call("GET", user, path + f"&cursor={cursor}" * k)
                times[k].append(took)
                ids, cursor = [p["id"] for p in body["posts"]], body["cursor"]
                if ids != pages[k] and len(bad) < 5:
                    bad.append(f"page {k + 1}: {len(ids)} posts ({len(pages[k])} expected), "
                               f"{len(set(ids) - set(pages[k]))} unexpected, order ok: "
                               f"{ids == sorted(ids, reverse=True)}")
            if cursor is None and len(exp) > 2 * LIMIT and len(bad) < 5:
                bad.append("page 2 has no cursor")
        return {"user": user, "timeline_posts": len(exp), "cold_ms": ms(cold),
                "page1": summary(times[0]), "page2": summary(times[1]), "problems": bad,
                "pulled_on_page": [len(marked & set(p)) for p in pages],
                "queries": await self.replay(ns, user)}

    async def replay(self, ns: str, user: str, reps: int = 20) -> list[dict[str, Any]]:
        """The store calls of one first-page read (FeedService.timeline), timed alone."""
        db = self.mongo[ns]
        posts, timelines = PostsMongo(db), TimelineMongo(db)
        cache = FeedCacheRedis(self.redis, Keys(ns), FollowsMongo(db), posts)
        counters = CountersRedis(self.redis, Keys(ns))
        authors = await cache.following(user) | {user}
        floor, pulls = await cache.floor(user), await cache.pull_max(authors)
        want = LIMIT + 1
        raw = await timelines.page(user, floor, None, 2 * want)
        docs = list((await posts.get_posts([p for p, _ in raw[:LIMIT]])).values())
        steps: list[tuple[str, Any, bool, Callable[[], Awaitable[Any]]]] = [
            ("redis: following, floor, pull_max (parallel)", len(authors), True,
             lambda: asyncio.gather(cache.following(user), cache.floor(user),
                                    cache.pull_max(authors))),
            ("mongo: timeline window ((u, p) index, limit 102)", len(raw), True,
             lambda: timelines.page(user, floor, None, 2 * want)),
            ("mongo: unpushed posts per pulled author (parallel)", len(pulls), bool(pulls),
             lambda: asyncio.gather(*(posts.by_author(a, None, want, top_level=True,
                                                      unpushed=True) for a in pulls))),
            ("redis: fan-outs under way (zset)", len(authors), True,
             lambda: cache.pending_below(None)),
            ("mongo: authors' posts (author $in; window short)", len(authors),
             len(raw) < 2 * want, lambda: posts.by_authors(sorted(authors), None, want)),
            ("mongo: get_posts (_id $in)", len(docs), True,
             lambda: posts.get_posts([d["_id"] for d in docs])),
            ("redis: counts of the page (Lua pipeline)", len(docs), True,
             lambda: counters.counts(docs))]
        out = []
        for label, n, used, step in steps:
            samples = [(await common.timed(step()))[0] for _ in range(reps)]
            out.append({"query": label, "n": n, "in_read": used, "max_ms": ms(max(samples)),
                        "p50_ms": ms(statistics.median(samples))})
        return out

    async def pull_setup(self, http: Http) -> dict[str, Any]:
        a = self.args
        authors = [f"w{i:03d}" for i in range(a.authors)]
        step = max(1, min(2 * LIMIT, a.authors) // a.big)
        big = sorted({max(0, a.authors - step // 2 - step * k) for k in range(a.big)})
        for i in big:
            authors[i] = f"big{i:03d}"
        others = [f"x{i:03d}" for i in range(a.big_followers - 1)]
        pairs = [("r", w) for w in authors] + [(x, authors[i]) for i in big for x in others]
        follow_s = await self.follow(http, pairs)
        self.reader_posts, self.pulled, t = [], set(), time.perf_counter()
        for k in range(a.author_posts):
            for i, w in enumerate(authors):
                self.reader_posts.append((await http.post(w, f"post {k} of {w}"))[1])
                if i in big:
                    self.pulled.add(self.reader_posts[-1])
        post_s = round(time.perf_counter() - t, 2)
        unpushed = await self.mongo[self.ns_b]["posts"].count_documents({"pushed": False})
        await self.settled(self.ns_b)
        return {"follows": len(pairs), "follow_s": follow_s, "posts": len(self.reader_posts),
                "post_s": post_s, "big_authors": [authors[i] for i in big],
                "unpushed_posts": unpushed}

    async def close(self) -> dict[str, Any]:
        for h in self.https:
            await h.users.aclose()
        await self.run.stop_nodes([n for n in self.nodes if n.proc and n.proc.returncode is None])
        try:
            out = await self.run.cleanup()
            await self.mongo.drop_database(self.raw_db)
        finally:
            await self.mongo.close()
            await self.redis.aclose()
        return out


# -- report ---------------------------------------------------------------------------
def lat4(s: dict[str, Any]) -> str:
    return lat(s, "p50 mean p99 max")


def render(res: dict[str, Any]) -> str:
    s, f, r = res["settings"], res.get("fanout"), res.get("raw")
    lines = header_lines("Feed benchmark", res, f"; load avg at end {res['loadavg_at_end'][0]:.2f}")
    lines += [f"- namespaces {res['namespaces']}; node A: default IM_FEED_PUSH_MAX, node B: "
              f"IM_FEED_PUSH_MAX={s['pull_max']}", ""]
    lines += [f"**ERROR**: {res['error']}", ""] if "error" in res else []
    if su := res.get("fanout_setup"):
        lines += [f"Setup (not timed): {fmt(su['follows'])} follows over HTTP in {su['follow_s']}"
                  f" s ({fmt(su['follows_per_s'])}/s); author's followers "
                  f"{fmt(su['author_followers'])}; {su['fill_posts']} fill posts.", ""]
    head = ["ms: p50 / mean / p99 / max", "value"]
    if f:
        w = [p for p in f["posts"] if p["warmup"]]
        lines += [f"## 1. Fan-out: {s['posts']} posts, {fmt(s['followers'])} followers", ""]
        lines += md_table(head, [
            ["POST /v1/posts (request -> response)", lat4(f["post"])],
            [f"request -> all {fmt(s['followers'])} timelines have it", lat4(f["all_timelines"])],
            [f"all {fmt(f['expected_entries'])} entries (followers + author) present",
             "yes" if f["complete"] else "**NO**"],
            ["PostgreSQL baseline average", f"{SEED_002_S * 1000:,.0f}"],
            ["speed-up vs PostgreSQL (mean)", f"{f['speedup_vs_seed_002']}x (target 10x)"],
            ["first (warm-up) post: POST / all timelines",
             f"{fmt(w[0]['post_ms'])} / {fmt(w[0]['all_timelines_ms'])}" if w else "-"]])
    if r:
        lines += [f"## 2. Raw store: {fmt(r['docs'])} docs per rep, {s['raw_reps']} reps, "
                  "no node", ""]
        lines += md_table(head, [
            [f"insert_many of {FANOUT_CHUNK} (w=majority, j=true), sum", lat4(r["insert"])],
            ["read the follower pages (fans), sum", lat4(r["fans_read"])],
            [f"Redis pipelines of {FANOUT_CHUNK} HINCRBY, sum", lat4(r["redis"])],
            ["all three, sequential (a fan-out's store work)", lat4(r["total"])],
            ["insert docs/s", r["docs_per_s"]],
            ["fan-out p50 / raw (all three) p50", round(
                f["all_timelines"]["p50_ms"] / r["total"]["p50_ms"], 2) if f else "-"]])
    reads = [t for t in (res.get("read_pushed"), res.get("read_pulled")) if t]
    if reads:
        lines += ["## 3. Timeline reads (ms: p50 / mean / p99 / max)", ""]
        lines += md_table(["", "3a. follower (all pushed)", f"3b. {s['authors']} authors, "
                           f"{s['big']} pulled ({s['big_followers']} followers > "
                           f"{s['pull_max']})"][:len(reads) + 1], [[label] + [get(t) for t in reads]
            for label, get in (
                ("timeline posts", lambda t: f"{t['timeline_posts']}: {t.get('setup', '-')}"),
                ("cold first call", lambda t: t["cold_ms"]),
                ("page 1 (limit 50)", lambda t: lat4(t["page1"])),
                ("page 2 (cursor)", lambda t: lat4(t["page2"])),
                ("pulled posts on page 1 / 2", lambda t: " / ".join(map(str, t["pulled_on_page"]))),
                ("pages checked / problems", lambda t: f"{2 * t['page1']['count']} / "
                 f"{'; '.join(t['problems']) or 'none'}"))])
        lines += ["Store calls of one first-page read, each replayed alone 20 x "
                  "(ms: p50 / max; \"-\" = not part of this read):", ""]
        lines += md_table(["call"] + [f"3{'ab'[i]}" for i in range(len(reads))], [
            [q["query"]] + [f"{t['queries'][i]['n']}: {fmt(t['queries'][i]['p50_ms'])} / "
                            f"{fmt(t['queries'][i]['max_ms'])}" if t["queries"][i]["in_read"]
                            else "-" for t in reads] for i, q in enumerate(reads[0]["queries"])])
    lines += ["## CPU by phase (cores)", ""] + md_table(
        ["phase", "s", "machine busy %", "top processes", "others (not ours, not servers)"],
        [[c["phase"], c["seconds"], c["machine_busy_pct"],
          ", ".join(f"{p['what'][:26]} {p['cores']:.2f}" for p in c["top"][:4]),
          f"{c['other_cores']:.2f}" + "".join(f" ({p['what'][:40]})" for p in c["other_top"][:1])]
         for c in res["cpu"]])
    lines += node_lines(res["nodes"])
    return "\n".join(lines + [f"- HTTP requests retried after a transport error: "
                               f"{res['http_retries']}"])


# -- main ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.new_parser("bench.feed_bench", __doc__, (
        ("--followers", int, 5000, "followers of the fan-out author"),
        ("--posts", int, 10, "measured fan-out posts"),
        ("--warmup-posts", int, 1, "unmeasured fan-out posts first"),
        ("--fill", int, 150, "authors (1 post each) the reader of 3a also follows"),
        ("--poll-ms", float, 10.0, "fan-out completion poll interval"),
        ("--raw-reps", int, 5, "raw store repetitions"),
        ("--authors", int, 200, "authors the reader of 3b follows"),
        ("--big", int, 5, "of them above node B's push threshold"),
        ("--big-followers", int, 60, "followers of each big author"),
        ("--author-posts", int, 3, "posts per author in 3b"),
        ("--pull-max", int, 50, "node B's IM_FEED_PUSH_MAX"),
        ("--repeat", int, 200, "timeline reads (page 1 + page 2) per reader")))
    p.add_argument("--quick", action="store_true",
                   help="500 followers, 3 posts, 120 fill, 60 authors, 30 reads, 2 raw reps")
    a = cli.parse(p, argv)
    if a.quick:
        a.followers, a.posts, a.fill, a.authors, a.repeat, a.raw_reps = 500, 3, 120, 60, 30, 2
    if (min(a.followers, a.posts, a.repeat, a.raw_reps, a.big, a.author_posts, a.poll_ms) <= 0
            or a.big > a.authors or a.big_followers <= a.pull_max or a.warmup_posts
            < 0 or min(a.fill + a.posts + a.warmup_posts, a.authors * a.author_posts) <= 2 * LIMIT):
        p.error("counts >= 1, --big <= --authors, --big-followers > --pull-max; both readers "
                f"need > {2 * LIMIT} posts (--fill + --posts, --authors x --author-posts)")
    return a


async def run(args: argparse.Namespace) -> dict[str, Any]:
    b, a = Bench(args), args
    res: dict[str, Any] = {"namespaces": [b.ns_a, b.ns_b], "cpu": b.cpu, "nodes": b.run.nodes}
    try:
        http = await b.start_node(b.ns_a, "A")
        res["fanout_setup"] = await b.phase("fan-out setup", b.fanout_setup(http),
                                            600 + a.followers * 0.2 + a.fill)
        res["fanout"] = await b.phase("fan-out posts", b.fanout_measure(http),
                                      300 * (a.posts + a.warmup_posts))
        await b.settled(b.ns_a)
        res["read_pushed"] = await b.phase("timeline reads 3a", b.reads(
            http, b.ns_a, "f00000", b.fill_posts + b.main_posts, set()), 300 + a.repeat * 3)
        res["read_pushed"]["setup"] = f"{a.fill} authors x 1 + {len(b.main_posts)} posts"
        await b.run.stop_nodes(b.nodes[:1])
        res["raw"] = await b.phase("raw store", b.raw_store(), 300 + a.raw_reps * a.followers / 50)
        http = await b.start_node(b.ns_b, "B", feed_push_max=a.pull_max)
        su = res["pull_setup"] = await b.phase("pull setup", b.pull_setup(http),
                                               900 + a.authors * a.author_posts)
        res["read_pulled"] = await b.phase("timeline reads 3b", b.reads(
            http, b.ns_b, "r", b.reader_posts, b.pulled), 300 + a.repeat * 3)
        res["read_pulled"]["setup"] = (f"{su['posts']} posts ({su['unpushed_posts']} unpushed) "
                                       f"in {su['post_s']} s, {su['follows']} follows")
    except Exception as exc:  # noqa: BLE001 - reported with what was measured
        res["error"] = f"{type(exc).__name__}: {exc}"
        log(f"failed: {res['error']}")
    finally:
        res["http_retries"] = sum(h.retries for h in b.https)
        res["cleanup"] = await b.close()
        res["loadavg_at_end"] = os.getloadavg()
    return res


def main(argv: list[str] | None = None) -> int:
    return cli.main("bench.feed_bench", argv, parse_args, run, render, lambda res: "error" in res)


if __name__ == "__main__":
    raise SystemExit(main())
