"""simindex.scrapy in real crawls: a generated news site with planted near-copies, served on
127.0.0.1 and crawled by `scrapy runspider` in subprocesses; and the settings, checked on a
real Crawler."""

import itertools
import json
import os
import random
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

scrapy = pytest.importorskip("scrapy")

import simindex  # noqa: E402
from simindex.signatures.similarity import jaccard, shingle_set  # noqa: E402
from conftest import ROOT  # noqa: E402

K = 8                 # the radius of every crawl here; the fixture is checked against it

# ------------------------------------------------------------------ the site
COMMON = ("the of and to a in is that for it as was with be by on not he this are or his "
          "from at which but have an they you were her she all their one been had we there "
          "has would more if will so can who about when up out them some into than its").split()
SYLLABLES = ("ba be bi bo bu ca ce co da de di do fa fe fi ga ge go ha he hi ho la le li lo "
             "lu ma me mi mo na ne ni no pa pe pi po ra re ri ro sa se si so ta te ti to va "
             "ve vi wa we ya zo ar er in on an el al or us ist ent ion").split()
AUTHORS = ["Maria Lopez", "John Carter", "Aiko Tanaka", "Peter Novak", "Sara Levi", "Omar Haddad"]
SECTIONS = ["World", "Business", "Science", "Culture", "Sport", "Opinion", "Weather"]
FOOTER = ("Copyright 2025 The Daily Example. All rights reserved. Contact the newsroom, "
          "advertise with us, read our privacy policy, terms of service and cookie settings. "
          "Subscribe to the morning newsletter for the stories of the day, delivered to your "
          "inbox before breakfast, and follow us on every platform you already use.")
AD = ("Advertisement. Save twenty percent on your first year of premium membership with code "
      "SPRING, unlimited articles, the crossword and the weekend magazine, cancel any time.")
KINDS = ["date", "ad", "byline", "sidebar"]     # how a planted near-copy differs


class Writer:
    """Distinct articles of 400-700 words: English function words and a seeded vocabulary
    of made-up words with a long-tailed frequency, in sentences and paragraphs."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        words = set()
        while len(words) < 3000:
            words.add("".join(self.rng.choice(SYLLABLES) for _ in range(self.rng.randint(2, 4))))
        self.vocab = sorted(words)

    def word(self):
        r = self.rng
        if r.random() < 0.4:
            return r.choice(COMMON)
        if r.random() < 0.3:
            return self.vocab[min(int(r.paretovariate(0.8)), len(self.vocab)) - 1]
        return r.choice(self.vocab)

    def paragraph(self):
        return " ".join(" ".join(self.word() for _ in range(self.rng.randint(8, 24)))
                        .capitalize() + "." for _ in range(self.rng.randint(3, 6)))

    def article(self):
        r = self.rng
        return {"title": " ".join(self.word() for _ in range(6)).capitalize(),
                "author": r.choice(AUTHORS),
                "date": f"2025-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
                "paragraphs": [self.paragraph() for _ in range(r.randint(8, 10))]}


def near_copy(a, kind):
    """A copy of article `a` as republished: a new date, an ad paragraph, a staff byline,
    or only the sidebar (outside the article) in another order."""
    a = dict(a, paragraphs=list(a["paragraphs"]))
    if kind == "date":
        a["date"] = "2026-01-15"
    elif kind == "ad":
        a["paragraphs"].insert(2, AD)
    elif kind == "byline":
        a["author"] = "Staff reporter"
    return a


def article_text(a):
    """The text the spider extracts: `article ::text`, joined with spaces."""
    return " ".join([a["title"], "By " + a["author"], "Published " + a["date"], *a["paragraphs"]])


def html_page(a, popular, related=None):
    """A whole page: nav, a 'most read' sidebar, the article, a related link, the footer."""
    nav = ('<a href="/more.html">More stories</a> '       # the front page is the start url
           + " ".join(f"<span>{s}</span>" for s in SECTIONS))
    side = "".join(f'<li><a href="{h}">{t}</a></li>' for h, t in popular)
    paras = "".join(f"<p>{p}</p>" for p in a["paragraphs"])
    rel = f'<p class="related"><a href="{related}">Related story</a></p>' if related else ""
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{a["title"]}</title>'
            f'</head><body><nav>{nav}</nav><aside class="sidebar"><h3>Most read</h3>'
            f'<ul>{side}</ul></aside><article><h1>{a["title"]}</h1>'
            f'<p class="byline">By {a["author"]}</p><p class="date">Published {a["date"]}</p>'
            f"{paras}</article>{rel}<footer>{FOOTER}</footer></body></html>")


def listing(title, links):
    items = "".join(f'<li><a href="{h}">{t}</a></li>' for h, t in links)
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{title}</title></head>'
            f"<body><h1>{title}</h1><ul>{items}</ul><footer>{FOOTER}</footer></body></html>")


class Site:
    """The pages (path -> html) and what each one is: `/a/i` originals and `/c/j` near-copies
    (of `copy_of[j]`), linked from /index.html and /more.html; `/only/j`, distinct pages that
    only copy j links to; later `/n/i` new distinct pages and `/nc/j` new near-copies."""

    def __init__(self, originals=160, copies=32, seed=12):
        self.writer = Writer(seed)
        self.articles = {}          # path -> article (every page with an article)
        self.html = {}              # path -> page
        self.original = {}          # near-copy path -> the path of its original
        self.popular = []
        self.front = []             # links of /index.html
        rng = random.Random(seed)
        for i in range(originals):
            self.articles[f"/a/{i}.html"] = self.writer.article()
        self.popular = [(p, self.articles[p]["title"]) for p in list(self.articles)[:5]]
        for p in list(self.articles):
            self._put(p, self.articles[p])
        self.front = [(p, self.articles[p]["title"]) for p in list(self.articles)]
        more = []
        for j, src in enumerate(rng.sample(sorted(self.articles), copies)):
            more.append((self._copy(f"/c/{j}.html", src, KINDS[j % len(KINDS)],
                                    related=f"/only/{j}.html"), "Republished"))
            self.articles[f"/only/{j}.html"] = self.writer.article()
            self._put(f"/only/{j}.html", self.articles[f"/only/{j}.html"])
        self.html["/more.html"] = listing("More stories", more)
        self._front_page()

    def _front_page(self):
        self.html["/index.html"] = listing("The Daily Example",
                                           self.front + [("/more.html", "More stories")])

    def _put(self, path, a, related=None, popular=None):
        self.html[path] = html_page(a, popular or self.popular, related)

    def _copy(self, path, src, kind, related=None):
        self.articles[path] = near_copy(self.articles[src], kind)
        self._put(path, self.articles[path], related,
                  self.popular[::-1] if kind == "sidebar" else None)
        self.original[path] = src
        return path

    def add(self, new_distinct, copy_sources):
        """New pages linked from the front page: distinct ones and near-copies of the paths
        in `copy_sources`. Returns the new paths."""
        new = []
        for i in range(new_distinct):
            p = f"/n/{i}.html"
            self.articles[p] = self.writer.article()
            self._put(p, self.articles[p])
            new.append(p)
        for j, src in enumerate(copy_sources):
            new.append(self._copy(f"/nc/{j}.html", src, KINDS[j % len(KINDS)]))
        self.front += [(p, "New") for p in new]
        self._front_page()
        return new

    def text(self, path):
        return article_text(self.articles[path])

    def page(self, path):
        return self.html[path]

    def planted(self):
        return {tuple(sorted(pair)) for pair in self.original.items()}


def check_fixture(site):
    """The fixture is unambiguous at K, by article text and by whole page: exactly the
    planted pairs are within K bits, and every distinct pair is at least 3 bits further."""
    for paths, key in ((sorted(site.articles), site.text), (sorted(site.html), site.page)):
        fps = [simindex.fingerprint(key(p)) for p in paths]
        pairs = {tuple(sorted((paths[i], paths[j]))) for i, j in simindex.find_all(fps, k=K)}
        assert pairs == site.planted()
        at = dict(zip(paths, fps))
        close = max(simindex.hamming(at[c], at[o]) for c, o in site.original.items())
        far = min(simindex.hamming(at[a], at[b]) for a, b in itertools.combinations(paths, 2)
                  if tuple(sorted((a, b))) not in site.planted())
        assert close <= K < far - 2, (close, far)


class Server:
    """The site on 127.0.0.1 (an ephemeral port) in a thread; `requested` lists each path
    asked for."""

    def __init__(self, site):
        self.site, self.requested = site, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requested.append(self.path)
                body = outer.site.html.get(self.path)
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                data = (body or "not found").encode()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def site():
    s = Site()
    check_fixture(s)
    return s


@pytest.fixture
def server(site):
    srv = Server(site)
    yield srv
    srv.close()


# ------------------------------------------------------------------ crawling
SPIDER = '''
import json
import scrapy


class SiteSpider(scrapy.Spider):
    """Every page of the site: an item with the url and the article's text (a listing page
    has no article: its item has no text), and every link followed."""
    name = "site"
    custom_settings = SETTINGS

    def __init__(self, start, stats, **kw):
        super().__init__(**kw)
        self.start_urls, self.stats_file = [start], stats

    def parse(self, response):
        text = response.css("article ::text").getall()
        yield {"url": response.url, "text": " ".join(text)} if text else {"url": response.url}
        yield from response.follow_all(css="a")

    def closed(self, reason):
        stats = {k: v for k, v in self.crawler.stats.get_stats().items()
                 if isinstance(v, (int, str))}
        with open(self.stats_file, "w") as f:
            json.dump(dict(stats, reason=reason), f)
'''

BASE = {
    "LOG_LEVEL": "INFO", "CONCURRENT_REQUESTS": 1, "DOWNLOAD_DELAY": 0,
    "ROBOTSTXT_OBEY": False, "TELNETCONSOLE_ENABLED": False, "REMOTE_CONTROL_ENABLED": False,
    "RETRY_ENABLED": False,
    # breadth-first, so an original (depth 1) is always seen before its copy (depth 2)
    "DEPTH_PRIORITY": 1, "SCHEDULER_DISK_QUEUE": "scrapy.squeues.PickleFifoDiskQueue",
    "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
    "SIMINDEX_K": K,
}


class Crawl:
    """One `scrapy runspider` run: its items (by url), stats and log."""

    def __init__(self, tmp_path, name, url, settings):
        feed, stats, log = (tmp_path / f"{name}.{ext}" for ext in ("jsonl", "json", "log"))
        spider = tmp_path / f"spider_{name}.py"
        spider.write_text(SPIDER.replace("SETTINGS", repr(dict(
            BASE, FEEDS={str(feed): {"format": "jsonlines", "overwrite": True}},
            LOG_FILE=str(log), **settings))))
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.run([sys.executable, "-m", "scrapy", "runspider", str(spider),
                            "-a", f"start={url}/index.html", "-a", f"stats={stats}"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        self.log = log.read_text() if log.exists() else ""
        assert p.returncode == 0, (p.stderr, self.log[-3000:])
        assert "Traceback" not in self.log, self.log
        self.stats = json.loads(stats.read_text())
        rows = [json.loads(line) for line in feed.read_text().splitlines()] \
            if feed.exists() else []
        self.items = {r["url"]: r for r in rows}
        assert len(self.items) == len(rows)
        self.base = url

    def paths(self, with_text=True):
        return {u[len(self.base):] for u, r in self.items.items() if ("text" in r) == with_text}

    def drops(self):
        """{copy path: (original path, distance)} from the 'Dropped:' log lines."""
        found = re.findall(r"Dropped: simindex: (\S+) is a near-copy of (\S+) \((\d+) bits apart, "
                           r"k=(\d+)\)", self.log)
        assert all(int(k) == K for *_, k in found)
        n = len(self.base)
        return {c[n:]: (o[n:], int(d)) for c, o, d, _ in found}


def count(crawl, key):
    return crawl.stats.get(key, 0)


def test_pipeline_drops_exactly_the_near_copies_across_a_pause_and_a_resume(
        tmp_path, site, server):
    jobdir = tmp_path / "job"
    settings = {"JOBDIR": str(jobdir), "SIMINDEX_DEBUG": True,
                "ITEM_PIPELINES": {"simindex.scrapy.NearDuplicatePipeline": 300}}
    # the first run stops part way through the near-copies (as Ctrl-C would) ...
    first = Crawl(tmp_path, "first", server.url, dict(settings, CLOSESPIDER_PAGECOUNT=180))
    assert first.stats["reason"] == "closespider_pagecount"
    assert (jobdir / "simindex" / "items").is_dir()            # the default SIMINDEX_PATH
    dropped_1 = first.drops()
    assert 0 < len(dropped_1) < len(site.original)
    for copy, (orig, d) in dropped_1.items():
        assert site.original[copy] == orig
        assert d == simindex.hamming(simindex.fingerprint(site.text(copy)),
                                     simindex.fingerprint(site.text(orig)))
    kept_1 = first.paths()
    assert not kept_1 & set(site.original)                      # no near-copy kept
    assert count(first, "simindex/kept") == len(kept_1)
    assert count(first, "simindex/dropped") == len(dropped_1)
    assert count(first, "simindex/errors") == len(first.paths(with_text=False)) == 2
    assert first.stats["item_dropped_count"] == len(dropped_1)

    # ... then new pages appear: distinct ones and near-copies of pages kept in the first run
    sources = sorted(p for p in kept_1 if p not in site.original.values())[:8]
    new = site.add(6, sources)
    check_fixture(site)
    second = Crawl(tmp_path, "second", server.url, settings)    # resumes the same JOBDIR
    assert second.stats["reason"] == "finished"
    dropped_2 = second.drops()
    for copy, (orig, _) in dropped_2.items():
        assert site.original[copy] == orig
    new_copies = {p for p in new if p in site.original}
    assert new_copies <= set(dropped_2)
    assert {site.original[p] for p in new_copies} <= kept_1     # copies of first-run pages
    kept_2 = second.paths()
    assert not kept_1 & kept_2                                  # resumed, not restarted
    # together: every page with an article is kept once, but exactly the planted copies
    assert set(dropped_1) | set(dropped_2) == set(site.original)
    assert kept_1 | kept_2 == set(site.articles) - set(site.original)
    assert set(new) - new_copies <= kept_2
    assert count(second, "simindex/kept") == len(kept_2)
    assert count(second, "simindex/dropped") == len(dropped_2)
    assert count(second, "simindex/errors") == 1                # the front page, fetched again


def test_middleware_ignores_near_copy_pages_and_never_follows_their_links(tmp_path, site, server):
    crawl = Crawl(tmp_path, "mw", server.url, {
        "SIMINDEX_PATH": str(tmp_path / "simindex"),
        "DOWNLOADER_MIDDLEWARES": {"simindex.scrapy.NearDuplicateMiddleware": 540}})
    copies = set(site.original)
    requested = set(server.requested)
    assert copies <= requested                                  # downloaded, then ignored
    assert not copies & crawl.paths()                           # never parsed
    only = {p for p in site.html if p.startswith("/only/")}
    assert not only & requested                                 # their links never followed
    pages = set(site.html) - copies - only
    assert crawl.paths() | crawl.paths(with_text=False) == pages
    assert count(crawl, "simindex/responses/ignored") == len(copies)
    assert count(crawl, "simindex/responses/kept") == len(pages)
    assert count(crawl, "simindex/responses/errors") == 0
    lines = re.findall(r"simindex: ignored <200 (\S+)>, a near-copy of (\S+) ", crawl.log)
    assert len(lines) == 1 and "no more near-copies will be shown" in crawl.log
    (copy, orig), = lines
    assert site.original[copy[len(server.url):]] == orig[len(server.url):]


def test_pipeline_with_a_similarity_threshold_drops_exactly_the_similar_items(
        tmp_path, site, server):
    """SIMINDEX_MIN_SIMILARITY = 0.7 and no k: the index is made for Jaccard >= 0.7 from the
    model, and an item is dropped exactly when a kept one is that similar."""
    texts = {p: site.text(p) for p in site.articles}
    sets = {p: shingle_set(t, "minhash-v1") for p, t in texts.items()}
    for copy, orig in site.original.items():
        assert jaccard(sets[copy], sets[orig]) >= 0.7
    originals = sorted(set(site.articles) - set(site.original))
    assert max(jaccard(sets[a], sets[b]) for i, a in enumerate(originals)
               for b in originals[i + 1:]) < 0.5
    crawl = Crawl(tmp_path, "similar", server.url, {
        "SIMINDEX_PATH": str(tmp_path / "simindex"), "SIMINDEX_K": None,
        "SIMINDEX_MIN_SIMILARITY": 0.7, "SIMINDEX_DEBUG": True,
        "ITEM_PIPELINES": {"simindex.scrapy.NearDuplicatePipeline": 300}})
    found = re.findall(r"Dropped: simindex: (\S+) is a near-copy of (\S+) \(jaccard >= 0.7, "
                       r"(\d+) bits apart, k=(\d+)\)", crawl.log)
    n = len(server.url)
    assert {c[n:]: o[n:] for c, o, _d, _k in found} == site.original
    with simindex.Index(str(tmp_path / "simindex" / "items"), readonly=True) as idx:
        assert idx.scheme == "minhash-v1"
        assert idx.calibration["min_similarity"] == 0.7
        assert {int(k) for *_, k in found} == {idx.k}
    assert crawl.paths() == set(originals)
    assert count(crawl, "simindex/dropped") == len(site.original)


# ------------------------------------------------------------------ settings, on a real Crawler
def pipeline(**settings):
    from scrapy.utils.test import get_crawler

    from simindex.scrapy import NearDuplicatePipeline
    return NearDuplicatePipeline.from_crawler(get_crawler(settings_dict=settings))


class Article(scrapy.Item):
    url = scrapy.Field()
    body = scrapy.Field()


def test_disabled_bad_and_mismatched_settings(tmp_path):
    from scrapy.exceptions import NotConfigured
    with pytest.raises(NotConfigured, match="SIMINDEX_ENABLED"):
        pipeline(SIMINDEX_ENABLED=False)
    for bad, match in [({"SIMINDEX_K": "three"}, "SIMINDEX_K must be"),
                       ({"SIMINDEX_K": -1}, "SIMINDEX_K must be"),
                       ({"SIMINDEX_SCHEME": "md5"}, "SIMINDEX_SCHEME 'md5' is not"),
                       ({"SIMINDEX_FIELD": 3}, "SIMINDEX_FIELD must be"),
                       ({"SIMINDEX_PATH": 3}, "SIMINDEX_PATH must be"),
                       ({"SIMINDEX_MIN_SIMILARITY": 0}, "SIMINDEX_MIN_SIMILARITY must be"),
                       ({"SIMINDEX_MIN_SIMILARITY": "high"}, "SIMINDEX_MIN_SIMILARITY must"),
                       ({"SIMINDEX_MIN_SIMILARITY": 0.7, "SIMINDEX_RECALL": 1},
                        "SIMINDEX_RECALL must be"),
                       ({"SIMINDEX_RECALL": 0.9}, "SIMINDEX_RECALL is the recall")]:
        with pytest.raises(simindex.ParameterError, match=match):
            pipeline(**bad)
    p = pipeline(SIMINDEX_PATH=str(tmp_path / "s"), SIMINDEX_K=3)
    p.open_spider()
    p.close_spider()
    again = pipeline(SIMINDEX_PATH=str(tmp_path / "s"), SIMINDEX_K=5)
    with pytest.raises(simindex.ParameterError, match="SIMINDEX_K / SIMINDEX_SCHEME do not fit"):
        again.open_spider()
    with pytest.raises(simindex.ParameterError, match=r"SIMINDEX_K / SIMINDEX_SCHEME: k \(64\)"):
        pipeline(SIMINDEX_PATH=str(tmp_path / "t"), SIMINDEX_K=64).open_spider()
    # a threshold the existing index has no radius for is refused when the spider opens
    with pytest.raises(simindex.ParameterError, match="SIMINDEX_MIN_SIMILARITY do not fit .* "
                                                      "keeps no text sketches"):
        pipeline(SIMINDEX_PATH=str(tmp_path / "s"), SIMINDEX_MIN_SIMILARITY=0.8).open_spider()
    # a new index that cannot judge the threshold is not left behind
    with pytest.raises(simindex.ParameterError, match="simindex-v1 .* needs a sample"):
        pipeline(SIMINDEX_PATH=str(tmp_path / "v"), SIMINDEX_SCHEME="simindex-v1",
                 SIMINDEX_MIN_SIMILARITY=0.8).open_spider()
    assert not (tmp_path / "v" / "items").exists()
    with pytest.raises(simindex.ParameterError, match="keeps no text sketches"):
        pipeline(SIMINDEX_PATH=str(tmp_path / "v"), SIMINDEX_SCHEME="simindex-v1", SIMINDEX_K=4,
                 SIMINDEX_MIN_SIMILARITY=0.8).open_spider()
    assert not (tmp_path / "v" / "items").exists()
    # SIMINDEX_K with a threshold: a minhash-v1 index searched at that k
    both = pipeline(SIMINDEX_PATH=str(tmp_path / "w"), SIMINDEX_K=9, SIMINDEX_MIN_SIMILARITY=0.8)
    both.open_spider()
    assert (both.checker.index.scheme, both.checker.index.k) == ("minhash-v1", 9)
    assert both.checker.index.text_check(0.8, 9) == simindex.TextCheck(9, 0.8, "jaccard")
    both.close_spider()
    made = pipeline(SIMINDEX_PATH=str(tmp_path / "u"), SIMINDEX_MIN_SIMILARITY=0.9,
                    SIMINDEX_RECALL=0.999)
    made.open_spider()
    assert made.checker.index.calibration["recall"] == 0.999
    made.close_spider()


def test_default_path_jobdir_then_project_data_dir(tmp_path, monkeypatch):
    from scrapy.utils.test import get_crawler

    from simindex.scrapy import index_path
    s = get_crawler(settings_dict={"JOBDIR": str(tmp_path / "job")}).settings
    assert index_path(s, "items") == str(tmp_path / "job" / "simindex" / "items")
    monkeypatch.chdir(tmp_path)                                          # not in a project
    assert index_path(get_crawler().settings, "items") == os.path.join(".scrapy", "simindex",
                                                                       "items")


def test_items_fields_callables_errors_and_reset(tmp_path):
    from scrapy.exceptions import DropItem
    w = Writer(3)
    text, other = article_text(w.article()), article_text(w.article())
    p = pipeline(SIMINDEX_PATH=str(tmp_path), SIMINDEX_FIELD="body")
    p.open_spider()
    assert p.process_item(Article(url="u1", body=text)) == Article(url="u1", body=text)
    with pytest.raises(DropItem, match=r"simindex: u2 is a near-copy of u1 \(0 bits apart, k=3\)"
                       r" - no more near-copies"):
        p.process_item({"url": "u2", "body": text})
    with pytest.raises(DropItem) as e:
        p.process_item({"url": "u3", "body": text})
    assert e.value.log_level == "DEBUG" and "no more" not in str(e.value)
    passed = [{"url": "u4"}, {"url": "u5", "body": ["a list"]}, {"body": other},
              {"url": "u6", "body": ""}]                     # missing, not text, no id, no token
    assert [p.process_item(i) for i in passed] == passed
    stats = p.checker.crawler.stats.get_stats()
    assert (stats["simindex/kept"], stats["simindex/dropped"], stats["simindex/errors"]) \
        == (1, 2, 4)
    p.close_spider()

    q = pipeline(SIMINDEX_PATH=str(tmp_path), SIMINDEX_FIELD=lambda item: item["body"].upper(),
                 SIMINDEX_ID=lambda item: item["n"])
    q.open_spider()
    with pytest.raises(DropItem, match="simindex: 7 is a near-copy of u1"):   # casefolded
        q.process_item({"n": 7, "body": text})
    q.close_spider()
    r = pipeline(SIMINDEX_PATH=str(tmp_path), SIMINDEX_FIELD="body", SIMINDEX_RESET=True)
    r.open_spider()
    assert r.checker.index is not None and len(r.checker.index) == 0
    assert r.process_item({"url": "u2", "body": text})
    r.close_spider()
