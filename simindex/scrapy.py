"""Scrapy integration: drop near-duplicate items, ignore near-duplicate pages.

`NearDuplicatePipeline` drops an item whose text is within k bits of one already kept;
`NearDuplicateMiddleware` ignores a downloaded page whose body is, before the spider parses
it (so a near-copy's links are never followed). With SIMINDEX_MIN_SIMILARITY = t a
near-copy is one of Jaccard similarity t or more (a new index is made for t from the model,
see simindex.calibrate; SIMINDEX_RECALL sets its target recall). Both call
`Index.add_unique_text`, which checks and inserts atomically, so crawler processes sharing
one index admit exactly one page of a group of near-identical ones, and a resumed crawl
(JOBDIR) remembers what it kept. Install with `pip install 'simindex[scrapy]'`; the core
package never imports Scrapy.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

try:
    from itemadapter import ItemAdapter
    from scrapy import signals
    from scrapy.exceptions import DropItem, IgnoreRequest, NotConfigured
    from scrapy.http import TextResponse
    from scrapy.utils.job import job_dir
    from scrapy.utils.project import data_path
except ImportError as e:                                   # pragma: no cover
    raise ImportError("simindex.scrapy needs Scrapy 2.11 or later: "
                      "pip install 'simindex[scrapy]'") from e

from .engine._layout import MANIFEST
from .errors import Error, InputError, ParameterError, ParameterTypeError
from .signatures.fingerprints import schemes
from .index import Index
from .radius import DEFAULT_RECALL, calibrate
from .engine.results import Id, Match

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

__all__ = ["NearDuplicatePipeline", "NearDuplicateMiddleware", "SKIP_META"]

logger = logging.getLogger(__name__)

SKIP_META = "simindex_skip"        # request.meta key: the middleware passes the response as is

Getter = Union[str, Callable[[Any], Any]]


def index_path(settings: BaseSettings, name: str) -> str:
    """Where a component keeps its index: SIMINDEX_PATH (default `<JOBDIR>/simindex`, or
    `.scrapy/simindex` in the project data directory without a JOBDIR), then `name`."""
    base = settings.get("SIMINDEX_PATH")
    if base is None:
        jobdir = job_dir(settings)
        base = os.path.join(jobdir, "simindex") if jobdir else data_path("simindex")
    if not isinstance(base, (str, os.PathLike)):
        raise ParameterTypeError(f"SIMINDEX_PATH must be a path, got {base!r:.60}")
    return os.path.join(os.fspath(base), name)


def _getter(settings: BaseSettings, name: str, default: Optional[str]) -> Optional[Getter]:
    """The setting `name` as a field name or a callable (None: not set and no default)."""
    value = settings.get(name, default)
    if value is None or isinstance(value, str) and value or callable(value):
        return value
    raise ParameterTypeError(f"{name} must be a field name or a callable, got {value!r:.60}")


def _k(settings: BaseSettings) -> Optional[int]:
    value = settings.get("SIMINDEX_K")
    if value is None:
        return None
    try:
        k = int(value)
    except (TypeError, ValueError):
        k = -1
    if isinstance(value, bool) or k < 0 or isinstance(value, float) and value != k:
        raise ParameterError(f"SIMINDEX_K must be a number of bits (an int >= 0), "
                             f"got {value!r:.60}")
    return k


def _share(settings: BaseSettings, name: str, low_open: bool = True) -> Optional[float]:
    """A setting that is a share: in (0, 1] (low_open) or in (0, 1)."""
    value = settings.get(name)
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = -1.0
    if isinstance(value, bool) or not (0 < v <= 1 if low_open else 0 < v < 1):
        raise ParameterError(f"{name} must be a number in (0, {'1]' if low_open else '1)'}, "
                             f"got {value!r:.60}")
    return v


def _scheme(settings: BaseSettings) -> Optional[str]:
    value = settings.get("SIMINDEX_SCHEME")
    if value is not None and value not in schemes:
        raise ParameterError(f"SIMINDEX_SCHEME {value!r:.60} is not a fingerprint scheme; "
                             f"known: {', '.join(schemes)}")
    return None if value is None else schemes[value].name


def _show(id: Id) -> str:
    return id if isinstance(id, str) else repr(id)


class _Checker:
    """One component's index, counters and drop log: `admit(id, text)` stores the text and
    returns None, or returns the nearest stored record within k bits."""

    def __init__(self, crawler: Crawler, name: str, stats_prefix: str, dropped: str) -> None:
        settings = crawler.settings
        if not settings.getbool("SIMINDEX_ENABLED", True):
            raise NotConfigured("SIMINDEX_ENABLED is False")
        self.crawler = crawler
        self.path = index_path(settings, name)
        self.k = _k(settings)
        self.scheme = _scheme(settings)
        self.min_similarity = _share(settings, "SIMINDEX_MIN_SIMILARITY")
        self.recall = _share(settings, "SIMINDEX_RECALL", low_open=False)
        if self.recall is not None and self.min_similarity is None:
            raise ParameterError("SIMINDEX_RECALL is the recall of SIMINDEX_MIN_SIMILARITY, "
                                 "which is not set")
        self.reset = settings.getbool("SIMINDEX_RESET", False)
        self.debug = settings.getbool("SIMINDEX_DEBUG", False)
        self.prefix = stats_prefix
        self.dropped = dropped         # the counter of near-copies: dropped or ignored
        self.index: Optional[Index] = None
        self.radius: Optional[int] = None      # k of the text calls with a threshold
        self.logged = False            # the first near-copy was logged with the note

    def open(self) -> None:
        """Open (create) the index; with SIMINDEX_RESET, remove the old one first."""
        if self.reset and os.path.exists(os.path.join(self.path, MANIFEST)):
            shutil.rmtree(self.path)           # only ever a directory holding an index
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        existed = os.path.exists(os.path.join(self.path, MANIFEST))
        names = "SIMINDEX_K / SIMINDEX_SCHEME" + (" / SIMINDEX_MIN_SIMILARITY"
                                                  if self.min_similarity is not None else "")
        # with a threshold: a radius of SIMINDEX_K if set (its recall is the user's), else
        # the one a new index is made for from the model (no page is known yet)
        self.radius = self.k if self.min_similarity is not None else None
        try:
            cal = None
            scheme = self.scheme
            if not existed and self.min_similarity is not None:
                scheme = scheme or "minhash-v1"            # the scheme that keeps sketches
                if self.k is None:
                    cal = calibrate([], self.min_similarity, scheme=scheme, recall=(
                        DEFAULT_RECALL if self.recall is None else self.recall))
            self.index = Index(self.path, k=self.k, scheme=scheme, calibration=cal)
            self.index.text_check(self.min_similarity, self.radius)   # its radius is known
        except (ParameterError, InputError) as e:
            if self.index is not None:
                self.index.close()
                self.index = None
            if not existed:
                if os.path.exists(os.path.join(self.path, MANIFEST)):
                    shutil.rmtree(self.path)         # made by this call: gone with it
                raise ParameterError(f"{names}: {e}") from e
            raise ParameterError(
                f"{names} do not fit the index at {self.path}: {e} (leave them unset to use "
                f"the index's, or set SIMINDEX_RESET = True to start from an empty "
                f"index)") from e
        check = self.index.text_check(self.min_similarity, self.radius)
        judge = "" if check is None else f"{check.measure} >= {check.t:g} at "
        logger.info("simindex: opened %s (%sk=%d, scheme %s, %d records)", self.path, judge,
                    self.index.k if check is None else check.k, self.index.scheme,
                    len(self.index))

    def close(self) -> None:
        if self.index is not None:
            self.index.close()

    def inc(self, key: str) -> None:
        assert self.crawler.stats is not None
        self.crawler.stats.inc_value(self.prefix + key)

    def admit(self, id: Any, text: Any) -> Optional[Match]:
        """The nearest record within k that kept `text` out, or None (stored; or, counted
        in errors, a missing or unusable id or text)."""
        if self.index is None:
            raise Error("simindex: the index is not open (open_spider was not called)")
        if not isinstance(text, str) or not isinstance(id, (str, bytes, int)):
            self.inc("errors")
            return None
        try:
            found = self.index.add_unique_text(id, text, k=self.radius,
                                               min_similarity=self.min_similarity)
        except InputError as e:                # no token in the text, an id too long ...
            logger.debug("simindex: %r not checked: %s", id, e)
            self.inc("errors")
            return None
        if not found:
            self.inc("kept")
            return None
        self.inc(self.dropped)
        return found[0]

    def describe(self, match: Match) -> str:
        if self.index is None:
            return f"a near-copy of {_show(match.id)} ({match.distance} bits apart)"
        check = self.index.text_check(self.min_similarity, self.radius)
        judge = "" if check is None else f"{check.measure} >= {check.t:g}, "
        k = self.index.k if check is None else check.k
        return f"a near-copy of {_show(match.id)} ({judge}{match.distance} bits apart, k={k})"

    def quiet(self) -> tuple[bool, str]:
        """(log this one in full, a note to append): every one with SIMINDEX_DEBUG, else
        only the first, as DUPEFILTER_DEBUG does."""
        if self.debug:
            return True, ""
        if not self.logged:
            self.logged = True
            return True, " - no more near-copies will be shown (see SIMINDEX_DEBUG)"
        return False, ""


class NearDuplicatePipeline:
    """Drops an item whose text is within k bits of an item already kept (DropItem names
    the kept one and the distance); keeps and stores every other."""

    def __init__(self, crawler: Crawler) -> None:
        self.checker = _Checker(crawler, "items", "simindex/", "dropped")
        settings = crawler.settings
        self.field = _getter(settings, "SIMINDEX_FIELD", "text")
        self.id = _getter(settings, "SIMINDEX_ID", "url")

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> NearDuplicatePipeline:
        return cls(crawler)

    def open_spider(self, spider: Optional[Spider] = None) -> None:
        self.checker.open()

    def close_spider(self, spider: Optional[Spider] = None) -> None:
        self.checker.close()

    def process_item(self, item: Any, spider: Optional[Spider] = None) -> Any:
        adapter = ItemAdapter(item)
        id_ = _get(self.id, adapter, item)
        match = self.checker.admit(id_, _get(self.field, adapter, item))
        if match is None:
            return item
        full, note = self.checker.quiet()
        drop = DropItem(f"simindex: {_show(id_)} is {self.checker.describe(match)}{note}")
        if not full:
            drop.log_level = "DEBUG"      # read by Scrapy >= 2.13; older ones log a WARNING
        raise drop


def _get(getter: Optional[Getter], adapter: ItemAdapter, item: Any) -> Any:
    if callable(getter):
        return getter(item)
    return adapter.get(getter) if getter is not None else None


class NearDuplicateMiddleware:
    """A downloader middleware: ignores (IgnoreRequest) a 2xx text response whose text is
    within k bits of a page already kept, before the spider parses it."""

    def __init__(self, crawler: Crawler) -> None:
        self.checker = _Checker(crawler, "responses", "simindex/responses/", "ignored")
        settings = crawler.settings
        self.text = _getter(settings, "SIMINDEX_RESPONSE_TEXT", None)
        self.id = _getter(settings, "SIMINDEX_RESPONSE_ID", None)
        for name, value in (("SIMINDEX_RESPONSE_TEXT", self.text),
                            ("SIMINDEX_RESPONSE_ID", self.id)):
            if value is not None and not callable(value):
                raise ParameterTypeError(f"{name} must be a callable (response -> value), "
                                         f"got {value!r:.60}")

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> NearDuplicateMiddleware:
        mw = cls(crawler)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    def spider_opened(self, spider: Spider) -> None:
        self.checker.open()

    def spider_closed(self, spider: Spider) -> None:
        self.checker.close()

    def process_response(self, request: Request, response: Response,
                         spider: Optional[Spider] = None) -> Response:
        if request.meta.get(SKIP_META) or not 200 <= response.status < 300:
            return response
        if callable(self.text):
            text = self.text(response)
            if text is None:
                return response
        elif isinstance(response, TextResponse):
            text = response.text
        else:
            return response                  # a binary body: nothing to compare
        id_ = self.id(response) if callable(self.id) else response.url
        match = self.checker.admit(id_, text)
        if match is None:
            return response
        full, note = self.checker.quiet()
        why = self.checker.describe(match)
        logger.log(logging.INFO if full else logging.DEBUG, "simindex: ignored <%d %s>, %s%s",
                   response.status, response.url, why, note)
        raise IgnoreRequest(f"simindex: {_show(id_)} is {why}")
