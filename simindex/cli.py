"""The `simindex` command: build, query and look after indexes from a shell.

A client of the library, nothing more: every command opens a simindex.Index. Results go to
stdout, progress and messages to stderr; exit 0 on success, 1 on an error (message only,
never a traceback), 2 on a usage error, 141 (quietly) when the reader of stdout closed it.
"""

import json
import os
import sys
import time
import zlib

import click
import msgpack

from . import (
    FORMAT_VERSION, BadLine, CorruptError, Error, Index, ParameterError, TextMatch,
    __version__, schemes,
)
from .engine import manifest
from .engine._lmdb import lmdb_version
from .inputs import FORMATS, FP_FORMATS, MAX_LINE, open_input, read_items
from .engine.results import json_id
from .engine.plan import (
    DEFAULT_K, Plan, candidate_plans, default_plan, default_shards, index_bytes,
    physical_memory, query_cost,
)

BATCH = 100_000


class _SchemeChoice(click.Choice):
    """A fingerprint scheme's name: the names are the choices shown, and an alias is taken
    as its scheme's name."""

    def __init__(self) -> None:
        super().__init__(list(schemes))

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value in schemes:
            return schemes[value].name
        return super().convert(value, param, ctx)


SCHEME = _SchemeChoice()
THRESHOLD = click.FloatRange(0, 1, min_open=True)           # a similarity to reach
RECALL = click.FloatRange(0, 1, min_open=True, max_open=True)  # a share of pairs to find
WIDTHS = ["64", "128", "256", "512", "768", "1024"]            # bits an index may hold
ALIASES = ", ".join(f"{a} for {s.name}" for s in schemes.values() for a in s.aliases)


def _progress(quiet, total=None, unit="rec"):
    """A tqdm bar on an interactive stderr, otherwise nothing; 80 columns by 24 lines on a
    terminal that reports no size (tqdm would draw nothing there)."""
    if quiet or sys.stderr is None or not sys.stderr.isatty():
        return None
    from tqdm import tqdm
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
        sized = size.columns > 0 and size.lines > 0
    except (OSError, ValueError):
        sized = False
    if sized:
        return tqdm(total=total, unit=unit, file=sys.stderr, dynamic_ncols=True)
    return tqdm(total=total, unit=unit, file=sys.stderr, ncols=80, nrows=24)


def _advance(bar, n):
    """Count n more on a bar whose total is an estimate (raised when passed)."""
    if bar is not None:
        if bar.total is not None and bar.n + n > bar.total:
            bar.total = bar.n + n
        bar.update(n)


def _say(msg, quiet=False):
    if not quiet:
        click.echo(msg, err=True)


def _fail(msg):
    click.echo(f"simindex: error: {msg}", err=True)
    sys.exit(1)


ray_option = click.option(
    "--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="ADDRESS",
    help="Serve the shards from Ray actors: join the Ray cluster at ADDRESS, or with no "
         "ADDRESS start a local one (needs: pip install 'simindex[ray]').")


def _cluster(index, address, ledgers=None, **check):
    """A simindex.distributed.Cluster on INDEX after the checks of _open (exit 1 on errors;
    an index of several ledgers is checked read-only, as it opens on one machine)."""
    readonly = check.get("readonly", False)
    if os.path.exists(os.path.join(index, manifest.NAME)) and _ledgers(index) > 1:
        check = dict(check, readonly=True)
    _open(index, **check).close()
    try:
        from .distributed import Cluster
    except ImportError as e:
        _fail(str(e))
    try:
        return Cluster(index, address=None if address == "local" else address,
                       readonly=readonly, ledgers=ledgers)
    except ParameterError as e:
        raise click.UsageError(str(e)) from None
    except Error as e:
        _fail(str(e))
    except (ConnectionError, RuntimeError, ValueError) as e:   # ray.init's failures
        _fail(f"cannot start or join the Ray cluster at {address}: {e}")


def _ledgers(index):
    try:
        return manifest.read(index).ledgers
    except Error as e:
        _fail(str(e))


def _hex(fp, width=64):
    return f"{fp:0{width // 4}x}"


def _open(path, k_at_most=None, **kw):
    """Index(path, **kw), its errors turned into exit 1 (usage errors: exit 2)."""
    try:
        idx = Index(path, **kw)
    except ParameterError as e:          # a parameter that breaks a rule or the manifest
        raise click.UsageError(str(e)) from None
    except Error as e:
        _fail(str(e))
    if k_at_most is not None and k_at_most > idx.k:
        k = idx.k
        idx.close()
        raise click.UsageError(f"--k {k_at_most} is above the index's k ({k}): its tables "
                               f"only guarantee matches up to {k} bits")
    return idx


common_input = [
    click.option("--format", "fmt", type=click.Choice([*FORMATS, "csv", "parquet"]),
                 help="Input format (default: .csv and .parquet files by their extension, "
                      "else from the first line: '{' means jsonl)."),
    click.option("--text-field", help="Read the inputs as dedup reads a dataset's rows (JSON "
                 "lines, CSV or Parquet files, or directories of them; other columns are not "
                 "stored): the column holding each row's text (default: text). CSV, Parquet "
                 "and directories are read so without it."),
    click.option("--id-field", help="As --text-field: the column holding each row's id "
                 "(default: FILE:ROW, as dedup names rows)."),
    click.option("--fingerprint-field", help="As --text-field: a column of fingerprints (hex "
                 "or integer) instead of texts."),
    click.option("--meta-field", help="As --text-field: a column stored as each record's meta "
                 "(default: none)."),
    click.option("--fp-format", type=click.Choice(FP_FORMATS), default="hex", show_default=True,
                 help="How fingerprints are written: hex digits, unsigned decimal, or signed "
                      "64-bit decimal (Spark/Java longs)."),
    click.option("--max-line", type=click.IntRange(1), default=MAX_LINE, show_default=True,
                 help="Longest input line accepted, in bytes."),
    click.option("--on-error", type=click.Choice(["stop", "skip"]), default="stop",
                 show_default=True, help="At a bad line: stop (exit 1) or report it and skip."),
    click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary."),
]


def input_options(f):
    for opt in reversed(common_input):
        f = opt(f)
    return f


class _Skips:
    def __init__(self, quiet):
        self.n = 0
        self.quiet = quiet

    def __call__(self, bad):
        self.n += 1
        click.echo(f"simindex: skipped {bad}", err=True)


def _dataset_rows(inputs, fmt, fields):
    """Whether the inputs are read as a dataset's rows (as dedup reads them): a column named,
    a CSV or Parquet format or file, or a directory."""
    from .datasets.rows import format_of
    if any(v is not None for v in fields.values()) or fmt in ("csv", "parquet"):
        return True
    for path in inputs:
        if path != "-" and os.path.isdir(path):
            return True
        try:
            if fmt is None and format_of(path) in ("csv", "parquet"):
                return True
        except Error:
            pass
    return False


def _items(inputs, fmt, fp_format, max_line, on_error, width, fields):
    """The Items of the inputs: records of TSV or JSON lines, or a dataset's rows."""
    if not _dataset_rows(inputs, fmt, fields):
        return read_items(inputs or ["-"], fmt, fp_format, max_line, on_error=on_error,
                          width=width)
    from .datasets.rows import row_items
    from .datasets.settings import input_files
    if not inputs or "-" in inputs:
        raise click.UsageError("a dataset's rows are read from files or directories, not "
                               "stdin")
    return row_items(input_files(inputs), None if fmt == "tsv" else fmt,
                     fields["text_field"] or "text", fields["id_field"],
                     fields["fingerprint_field"], fields["meta_field"], on_error, width)


def _fingerprinted(idx, inputs, fmt, fp_format, max_line, skips, on_error, fields):
    """(item, fingerprint, meta to store) of every input record; a text is fingerprinted
    with the index's scheme (its meta then keeps the text's sketch where the index keeps
    sketches), and a text without a fingerprint is a bad line like any other."""
    width = idx.width
    record = getattr(idx, "text_record", None)     # an Index (a Cluster keeps no sketch)
    for item in _items(inputs, fmt, fp_format, max_line,
                       skips if on_error == "skip" else None, width, fields):
        try:
            if item.text is None:
                fp, meta = item.fingerprint, item.meta
            elif record is not None:
                fp, meta = record(item.text, item.meta, item.id)
            else:
                fp, meta = idx.fingerprint(item.text), item.meta
        except Error as e:
            bad = BadLine(item.where, str(e))
            if on_error == "stop":
                raise bad from None
            skips(bad)
            continue
        yield item, fp, meta


def _build_calibration(index, inputs, fmt, fields, t, recall, *, scheme, width, ray):
    """The calibration of a new index built with --min-similarity (None for an existing
    one, which keeps its own and must have been made for t): from the input's first rows,
    read as dedup reads them."""
    from .datasets.settings import RUN_SAMPLE_BYTES, RUN_SAMPLE_ROWS, calibrate_inputs
    from .datasets.settings import input_files
    if ray is not None:
        raise click.UsageError("--min-similarity makes a new index on this machine: build it "
                               "without --ray, then serve it with a Cluster")
    if os.path.exists(os.path.join(index, manifest.NAME)):
        with _open(index, readonly=True) as idx:
            stored = idx.calibration
        if stored is None or stored["min_similarity"] != t or stored["measure"] != "jaccard":
            had = "none" if stored is None else f"{stored['measure']} >= " \
                f"{stored['min_similarity']:g}"
            raise click.UsageError(f"the index {index} exists, made for a threshold of "
                                   f"{had}: --min-similarity {t:g} makes a new index only")
        return None
    if not inputs or "-" in inputs:
        raise click.UsageError("--min-similarity calibrates on the input's first rows: "
                               "give files, not stdin")
    try:
        files = input_files(inputs)
        if fmt in (None, "tsv") and not all(_known_format(f) for f in files):
            fmt = "jsonl"                  # texts are records of JSON lines, whatever the name
        return calibrate_inputs(files, t, fmt=None if fmt in (None, "tsv") else fmt,
                                text_field=fields.get("text_field") or "text", recall=recall,
                                scheme=scheme, width=None if width is None else int(width),
                                sample=RUN_SAMPLE_ROWS,
                                sample_bytes=RUN_SAMPLE_BYTES, sample_truth=False,
                                bands=scheme is None)
    except Error as e:
        _fail(str(e))


READER_LEFT = 128 + 13        # the status of a producer whose reader closed the pipe (SIGPIPE)


class _Commands(click.Group):
    """The commands; one whose stdout's reader stops reading (`| head`) ends quietly with
    the status shells give a producer killed by SIGPIPE, 141, as `cat` and `yes` do."""

    def invoke(self, ctx):
        try:
            rv = super().invoke(ctx)
            if sys.stdout is not None:
                sys.stdout.flush()   # a pipe closed after the last write fails here
            return rv
        except BrokenPipeError:
            if not _stdout_closed():
                raise                # another pipe (a socket, a child): an error like any
            try:                     # what is still buffered for the closed pipe goes nowhere
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            raise SystemExit(READER_LEFT) from None


def _stdout_closed():
    """Whether stdout is a pipe whose reader has closed it (its write end then polls as an
    error)."""
    import select
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _fd, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    version=__version__, prog_name="simindex",
    message=(f"%(prog)s %(version)s, on-disk format {FORMAT_VERSION} (and 1, 2), "
             f"{lmdb_version()}, msgpack {'.'.join(map(str, msgpack.version))}"))
def cli():
    """Exact near-duplicate search over 64-, 128- and 256-bit simhash fingerprints."""


@cli.command(short_help="Add the records of INPUT files to INDEX, creating it if missing.")
@click.argument("index")
@click.argument("inputs", nargs=-1)
@click.option("--k", type=click.IntRange(0, 255), help="Bits of difference the index finds "
              "(new index; default 3).")
@click.option("--blocks", type=click.IntRange(1, 256), help="Blocks per fingerprint (new "
              "index; default k+1).")
@click.option("--width", type=click.Choice(WIDTHS), help="Bits per "
              "fingerprint (new index; default 64; 512 to 1024: codes of 16 to 32 MinHash "
              "bands); hex fingerprints then take up to width/4 digits.")
@click.option("--prefix-blocks", type=click.IntRange(0, 256), help="Blocks leading each "
              "table (new index; default blocks-k; fewer probe with flips, see `simindex "
              "plan`).")
@click.option("--shards", type=int, help="Shards, a divisor of 256 (new index; default 16).")
@click.option("--expected", type=click.IntRange(0), help="Fingerprints the new index will "
              "hold: picks the blocks of least estimated query time (see `simindex plan`).")
@click.option("--scheme", type=SCHEME, help="Text fingerprint scheme "
              f"(new index; default simindex-v1; aliases: {ALIASES}).")
@click.option("--jobs", "-j", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Shards written at once (threads; with --ray every shard has its actor).")
@click.option("--ledgers", type=click.IntRange(1, 1024), help="With --ray, split a new "
              "index's records over this many ledger actors, so that adds commit in all "
              "of them at once (the index then opens read-only on one machine).")
@click.option("--min-similarity", type=THRESHOLD, help="A new "
              "index made for this Jaccard threshold, as dedup makes one: its scheme, width "
              "and k calibrated on the input's first rows (its text calls, and dedup "
              "--index with it, judge by the threshold), or with --k (and --width, "
              "--scheme: default minhash-v1) the index at that radius, as `dedup --k` makes "
              "one. Texts only.")
@click.option("--recall", type=RECALL,
              help="With --min-similarity: the share of pairs at the threshold to find "
              "(default 0.99).")
@ray_option
@input_options
def build(index, inputs, k, blocks, width, prefix_blocks, shards, expected, scheme, jobs,
          ledgers, min_similarity, recall, ray_address, fmt, fp_format, max_line, on_error,
          quiet, **fields):
    """Create INDEX if missing, then add every record of INPUT files ('-': stdin): TSV or
    JSON lines records, or the rows of a dataset (JSON lines, CSV, Parquet, directories)
    as dedup reads them (see --text-field).

    Incremental: run it again with more input to add to the same index.
    """
    calibration = None
    if min_similarity is not None and k is not None:   # a radius given: no calibration
        if recall is not None:
            raise click.UsageError("--recall chooses k: give it or --k, not both")
        scheme = scheme or "minhash-v1"                 # (a scheme that keeps sketches)
    elif min_similarity is not None:
        calibration = _build_calibration(index, inputs, fmt, fields, min_similarity, recall,
                                         scheme=scheme, width=width, ray=ray_address)
    elif recall is not None:
        raise click.UsageError("--recall needs --min-similarity")
    if ray_address is None:
        if ledgers is not None:
            raise click.UsageError("--ledgers splits the records over Ray actors: give --ray")
        if calibration is not None:            # a new index made for the threshold
            k, scheme, width = calibration.k, calibration.scheme, calibration.width
            expected = expected or calibration.expected_rows
        idx = _open(index, k=k, blocks=blocks, shards=shards, scheme=scheme, expected=expected,
                    prefix_blocks=prefix_blocks, width=None if width is None else int(width),
                    calibration=None if calibration is None else calibration.stored())
        write = lambda batch: idx.add_many(batch, jobs=jobs)
    else:
        idx = _cluster(index, ray_address, ledgers, k=k, blocks=blocks, shards=shards,
                       scheme=scheme,
                       expected=expected, prefix_blocks=prefix_blocks,
                       width=None if width is None else int(width))
        write = idx.add_many
    skips = _Skips(quiet)
    added = 0
    start = time.perf_counter()
    bar = _progress(quiet)
    batch = []

    def commit():
        nonlocal added
        if batch:
            write(batch)
            added += len(batch)
            if bar is not None:
                bar.update(len(batch))
            batch.clear()

    error = None
    try:
        for item, fp, meta in _fingerprinted(idx, inputs, fmt, fp_format, max_line, skips,
                                             on_error, fields):
            batch.append((item.id, fp, meta))
            if len(batch) >= BATCH:
                commit()
        commit()
    except BadLine as e:
        commit()                        # every good line before the bad one goes in
        error = str(e)
    except Error as e:
        error = str(e)
    finally:
        if bar is not None:
            bar.close()
        idx.close()
    secs = time.perf_counter() - start
    summary = f"added {added} records, skipped {skips.n} lines, in {secs:.2f} s"
    if error:
        _fail(f"{error} ({summary}; everything before it is committed)")
    _say(f"simindex: {summary}", quiet)


@cli.command(short_help="Print the near-duplicates in INDEX of each record of INPUT.")
@click.argument("index")
@click.argument("inputs", nargs=-1)
@click.option("--k", type=click.IntRange(0, 255), help="Bits of difference (default and "
              "maximum: the index's k).")
@click.option("--output", type=click.Choice(["jsonl", "tsv"]), default="jsonl",
              show_default=True, help="jsonl: one line per query; tsv: one "
              "query_id<TAB>match_id<TAB>distance line per match (and <TAB>similarity, "
              "empty when unknown, in an index that judges texts by a threshold).")
@ray_option
@input_options
def query(index, inputs, k, output, ray_address, fmt, fp_format, max_line, on_error, quiet,
          **fields):
    """Print the near-duplicates in INDEX of every record of INPUT ('-': stdin)."""
    if sys.stdout is None:
        _fail("standard output is closed")
    if ray_address is None:
        idx = _open(index, k_at_most=k, readonly=True)
    else:
        idx = _cluster(index, ray_address, k_at_most=k, readonly=True)
    width = idx.width
    skips = _Skips(quiet)
    n = 0
    out = sys.stdout
    batch = []

    # a text in an index that judges texts by a threshold is asked as query_text asks it
    judged = isinstance(idx, Index) and idx.text_check() is not None

    def flush(results=None):
        nonlocal n
        if not batch:
            return
        if results is None:
            results = idx.query_many([fp for _, fp in batch], k=k)
        for (qid, _fp), ms in zip(batch, results):
            if output == "tsv":
                for m in ms:
                    sim = getattr(m, "similarity", None)
                    out.write(f"{qid}\t{m.id}\t{m.distance}" +
                              (f"\t{'' if sim is None else sim}" if judged else "") + "\n")
            else:
                out.write(json.dumps({"id": qid, "matches": [
                    {"id": json_id(m.id), "fingerprint": _hex(m.fingerprint, width),
                     "distance": m.distance, **({"similarity": m.similarity}
                                                if isinstance(m, TextMatch) else {})}
                    for m in ms]}) + "\n")
        n += len(batch)
        batch.clear()

    error = None
    try:
        for item, fp, _meta in _fingerprinted(idx, inputs, fmt, fp_format, max_line, skips,
                                              on_error, fields):
            if judged and item.text is not None:
                flush()
                batch.append((item.id, fp))
                flush([idx.query_text(item.text, k=k)])
                continue
            batch.append((item.id, fp))
            if len(batch) >= BATCH:
                flush()
        flush()
    except (BadLine, Error) as e:
        flush()
        error = str(e)
    finally:
        idx.close()
        out.flush()
    if error:
        _fail(f"{error} (answered {n} queries before it)")
    _say(f"simindex: answered {n} queries, skipped {skips.n} lines", quiet)


@cli.command(short_help="Print INDEX's parameters, counts and sizes.")
@click.argument("index")
def info(index):
    """Parameters, counts, runs, shards, bytes on disk, scheme and format of INDEX."""
    with _open(index, readonly=True) as idx:
        try:
            s = idx.stats()
        except Error as e:
            _fail(str(e))
    for key, value in s.items():
        click.echo(f"{key}\t{value}")


@cli.command(short_help="Print every near-duplicate pair in INDEX.")
@click.argument("index")
@click.option("--k", type=click.IntRange(0, 255), help="Bits of difference (default: the "
              "index's k).")
def pairs(index, k):
    """Every near-duplicate pair in INDEX: id_a<TAB>id_b<TAB>distance."""
    with _open(index, k_at_most=k, readonly=True) as idx:
        try:
            for a, b, d in idx.pairs(k=k):
                click.echo(f"{a}\t{b}\t{d}")
        except Error as e:
            _fail(str(e))


@cli.command(short_help="Print the groups of near-duplicates in INDEX, one per line.")
@click.argument("index")
@click.option("--k", type=click.IntRange(0, 255), help="Bits of difference (default: the "
              "index's k).")
def clusters(index, k):
    """Groups of near-duplicates in INDEX, one per line, ids separated by tabs."""
    with _open(index, k_at_most=k, readonly=True) as idx:
        try:
            for group in idx.clusters(k=k):
                click.echo("\t".join(map(str, group)))
        except Error as e:
            _fail(str(e))


@cli.command(short_help="Remove records from INDEX by id.")
@click.argument("index")
@click.argument("ids", nargs=-1)
@click.option("--input", "input_", help="Read ids, one per line, from this file ('-': stdin; "
              ".gz read transparently).")
@click.option("--int-ids", is_flag=True, help="The ids are integers (as stored from JSON "
              "numbers), not strings.")
def remove(index, ids, input_, int_ids):
    """Remove the records of IDS (or of the ids read from --input) from INDEX."""
    if not ids and not input_:
        raise click.UsageError("give ids to remove, or --input FILE")
    todo = list(ids)
    if input_:
        todo += _read_ids(input_)
    if int_ids:
        try:
            todo = [int(i) for i in todo]
        except ValueError as e:
            raise click.UsageError(f"--int-ids: {e}") from None
    removed = 0
    with _open(index, create=False) as idx:
        try:
            for id_ in todo:
                removed += idx.remove(id_)
        except Error as e:
            _fail(f"{e} (removed {removed} before it)")
    _say(f"simindex: removed {removed} of {len(todo)} ids")


def _read_ids(path):
    """Ids one per line from a file or stdin; a bad line stops with file:line: reason."""
    try:
        name, stream = open_input(path)
    except OSError as e:
        _fail(f"{path}: cannot read: {e.strerror or e}")
    out = []
    try:
        for n, raw in enumerate(stream, 1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                _fail(f"{name}:{n}: invalid UTF-8 at byte {e.start}")
            if line.strip():
                out.append(line)
    except (OSError, EOFError, zlib.error) as e:
        _fail(f"{name}: cannot read: {e}")
    finally:
        if path != "-":
            stream.close()
    return out


@cli.command(short_help="Check INDEX for damage; exit 1 if any is found.")
@click.argument("index")
def verify(index):
    """Check every table of INDEX against its records; exit 1 listing any damage."""
    try:
        with Index(index, readonly=True) as idx:
            problems = idx.verify()
    except CorruptError as e:
        from .engine.verify import files                  # too damaged to open: read the files
        for p in files(index):
            click.echo(p)
        _fail(str(e))
    except Error as e:
        _fail(str(e))
    for p in problems:
        click.echo(p)
    if problems:
        _fail(f"{len(problems)} problem(s) found")
    _say("simindex: index is sound")


@cli.command(short_help="Rebuild INDEX's damaged shards from its records.")
@click.argument("index")
@click.option("--accept-loss", is_flag=True, help="When the records hold fewer records than "
              "the tables say were committed (a records/ restored from an older copy), take "
              "them as they are: rebuild every shard from them, so the lost records are "
              "gone for good.")
def repair(index, accept_loss):
    """Rebuild the damaged shards of INDEX from its records, then verify it (records/ is
    never rebuilt: damage there exits 1, and so do records fewer than were committed,
    unless --accept-loss). Run it while no other process has INDEX open."""
    from .repair import repair as rebuild
    try:
        done = rebuild(index, accept_loss=accept_loss)
    except Error as e:
        _fail(str(e))
    for line in done:
        click.echo(line)
    _say(f"simindex: index is sound ({len(done)} repair(s) made)")


@cli.command(short_help="Merge INDEX's runs and drop removed records.")
@click.argument("index")
def compact(index):
    """Merge each table's runs of INDEX into one and drop removed entries."""
    with _open(index, create=False) as idx:
        try:
            idx.compact()
        except Error as e:
            _fail(str(e))
        s = idx.stats()
    _say(f"simindex: compacted: {s['runs']} runs, {s['bytes']} bytes on disk")


@cli.command(short_help="Print the table plans for SIZE fingerprints within K bits.")
@click.option("--size", type=click.IntRange(1), required=True, help="Expected fingerprints.")
@click.option("--k", type=click.IntRange(0, 255), default=DEFAULT_K, show_default=True,
              help="Bits of difference the plans must find (the radius of their queries).")
@click.option("--width", type=click.Choice(["64", "128", "256"]), default="64",
              show_default=True, help="Bits per fingerprint.")
@click.option("--top", type=click.IntRange(1), default=10, show_default=True,
              help="Plans shown, least estimated query time first.")
def plan(size, k, width, top):
    """Table plans for SIZE fingerprints within K bits, least estimated query time first,
    and the one `build --expected SIZE` picks, with the shards it picks (without
    --expected: 16 shards, and k+1 blocks below k=8). At width 128 or 256 the tables are
    sorted by their key's first 64 bits (find_all(width=...) uses these plans)."""
    width = int(width)
    if k >= width:
        raise click.UsageError(f"--k {k} must be below the width {width}")
    chosen = default_plan(k, size, width=width)
    nshards = default_shards(size)
    choice = f"<- build --expected {size} ({nshards} shard{'s' if nshards > 1 else ''})"
    memory = physical_memory()
    rows = sorted((query_cost(k, m, size, memory, p, width), m, p)
                  for m, p in candidate_plans(k, width))
    shown = rows[:top] + [r for r in rows[top:] if (r[1], r[2]) == chosen]
    click.echo("blocks\tprefix_blocks\ttables\tflips\tprobes\tprefix_bits"
               "\tcandidates_per_query\tquery_us\tbytes_on_disk\tchoice")
    for cost, m, p in shown:
        pl = Plan(k=k, blocks=m, shards=16, prefix_blocks=p, width=width)
        cands = sum(n * size / 2 ** min(b, 64) for n, b in zip(pl.probes, pl.prefix_bits))
        disk = index_bytes(k, m, size, p, width)
        bits = f"{min(pl.prefix_bits)}-{max(pl.prefix_bits)}" \
            if min(pl.prefix_bits) != max(pl.prefix_bits) else str(pl.prefix_bits[0])
        click.echo(f"{m}\t{p}\t{pl.ntables}\t{pl.flips}\t{sum(pl.probes)}\t{bits}\t"
                   f"{cands:.3g}\t{cost / 1000:.2g}\t{disk:.3g}\t"
                   f"{choice if (m, p) == chosen else ''}")


@cli.command(short_help="Print the width and k that a similarity threshold needs.")
@click.argument("inputs", nargs=-1, required=True)
@click.option("--min-similarity", type=THRESHOLD, required=True,
              help="The similarity threshold: pairs at or above it are the ones to find.")
@click.option("--recall", type=RECALL,
              default=0.99, show_default=True, help="The share of pairs at the threshold "
              "each width's k must find.")
@click.option("--containment", is_flag=True, help="Calibrate for the share of a row's "
              "shingles found in an earlier row, not the Jaccard similarity.")
@click.option("--scheme", type=SCHEME, help="The fingerprint scheme to calibrate (default: "
              "minhash-v1 at each width, and the band search of minhash-lsh-v1; aliases: "
              f"{ALIASES}).")
@click.option("--width", type=click.Choice(WIDTHS), help="Weigh only this "
              "width (default: every width of the scheme and of the band codes; 512 to 1024: "
              "16 to 32 MinHash bands).")
@click.option("--sample", type=click.IntRange(2), help="Rows read from the start of the "
              "input (default: what dedup reads, 1,000 rows or 2 MB of text, whichever comes "
              "first; with more, the marked width is that sample's).")
@click.option("--time-budget", type=click.FloatRange(0, min_open=True), metavar="SECONDS",
              help="The time the whole run may take: a width whose k would take longer gets "
              "the largest k that fits (its recall then falls below --recall, and the "
              "summary says so).")
@click.option("--text-field", default="text", show_default=True,
              help="The column holding each row's text.")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "parquet"]),
              help="Input format (default: from each file's extension).")
def calibrate(inputs, min_similarity, recall, containment, scheme, width, sample, time_budget,
              text_field, fmt):
    """Print, for each width, the k that finds --recall of the pairs at --min-similarity
    and what it costs: the model's recall (minhash-v1), the sample's pairs at the threshold
    and how many that k finds (with a 95% lower bound, which says little on few pairs: all
    of 59 found bound it at 0.95, 1 of 1 at 0.05), the pairs within k per row for the
    whole input, and the estimated search time per row and run time. The width of least
    time is marked: it is what `simindex dedup --min-similarity` chooses without --k."""
    from .datasets.settings import RUN_SAMPLE_BYTES, RUN_SAMPLE_ROWS, calibrate_inputs
    try:
        cal = calibrate_inputs(list(inputs), min_similarity, fmt=fmt, text_field=text_field,
                               recall=recall, scheme=scheme,
                               width=None if width is None else int(width),
                               measure="containment" if containment else "jaccard",
                               sample=RUN_SAMPLE_ROWS if sample is None else sample,
                               sample_bytes=RUN_SAMPLE_BYTES if sample is None else None,
                               time_budget=time_budget, bands=scheme is None)
    except Error as e:
        _fail(str(e))
    click.echo("scheme\twidth\tk\tmodel_recall\tsample_pairs\tfound\trecall_low"
               "\tcandidates_per_row\tquery_us\tseconds\tcapped\tchoice")
    for c in cal.table:
        model = "" if c.model_recall is None else f"{c.model_recall:.4f}"
        low = "" if c.recall_low is None else f"{c.recall_low:.4f}"
        chosen = c == cal.chosen
        click.echo(f"{c.scheme or cal.scheme}\t{c.width}\t{c.k}\t{model}\t{c.pairs}\t"
                   f"{c.found}\t{low}\t{c.candidates:.3g}\t{c.query_us:.3g}\t"
                   f"{c.seconds:.3g}\t{'yes' if c.capped else ''}\t"
                   f"{'<- chosen (least estimated time)' if chosen else ''}")
    click.echo(f"simindex calibrate: {cal.sample_rows} rows read, about {cal.expected_rows:,} "
               f"in the input; {cal.describe()}", err=True)


@cli.command(short_help="Write the rows of INPUTS without their near-duplicates.")
@click.argument("inputs", nargs=-1, required=True)
@click.option("--output", "-o", required=True, help="Where the kept rows go (written to a "
              "temporary name and renamed when complete; with --ray, a directory of part "
              "files). Format: --output-format, else its extension, else the first "
              "input's.")
@click.option("--text-field", default="text", show_default=True,
              help="The column holding each row's text.")
@click.option("--id-field", help="The column holding each row's id (default: FILE:ROW).")
@click.option("--fingerprint-field", help="A column of precomputed fingerprints (hex or "
              "integer) used instead of the text.")
@click.option("--k", type=click.IntRange(0, 255), help="Bits of difference that make a "
              "near-duplicate (default 3, or calibrated with --min-similarity; with an "
              "existing --index, at most its k).")
@click.option("--scheme", type=SCHEME, help="Fingerprint scheme of a new "
              "index (default simindex-v1; minhash-v1 with --min-similarity; aliases: "
              f"{ALIASES}).")
@click.option("--width", type=click.Choice(WIDTHS), help="Bits per fingerprint "
              "of a new index (default 64, or calibrated with --min-similarity; 512 to 1024: "
              "16 to 32 MinHash bands).")
@click.option("--index", "index_dir", help="Keep the index here: a later run removes what "
              "duplicates anything kept in this one.")
@click.option("--against", help="A reference index: rows near any of its records are "
              "removed; nothing is added to it.")
@click.option("--removed", help="Write each removed row here (JSON lines): id, where, "
              "match, distance, reference, similarity and evidence (exact or sketch), and "
              "the run's scheme, width, k and expected recall.")
@click.option("--clusters", "clusters_out", help="Write every row of a group of two or more "
              "(and the kept record it is known by) with its cluster id and size here (JSON "
              "lines).")
@click.option("--mode", type=click.Choice(["greedy", "components"]), help="greedy (default): "
              "add_unique's rule, in input order; components: one row per connected "
              "component of the near-duplicate graph (chains included).")
@click.option("--keep", default="first", show_default=True, help="Which row of a component "
              "stays: first, longest (text), or the name of a numeric column to maximise "
              "(implies --mode components).")
@click.option("--drop-all", is_flag=True, help="Remove every row of a group of two or more "
              "(implies --mode components).")
@click.option("--annotate", is_flag=True, help="Write every row to --output, with the columns "
              "simindex_duplicate_of, simindex_distance, simindex_cluster, "
              "simindex_cluster_size, simindex_similarity and simindex_evidence appended (empty "
              "for a kept row; the similarity with --min-similarity).")
@click.option("--min-similarity", type=THRESHOLD, help="Count a "
              "match only if the Jaccard similarity of the two texts' shingles is at least "
              "this (exact for rows of this run, from stored sketches for earlier runs'). "
              "Without --k, a new index takes the minhash-v1 scheme and the width and k "
              "calibrated on the input's first rows for --recall (see `simindex calibrate`).")
@click.option("--recall", type=RECALL,
              help="With --min-similarity and no --k: the share of pairs at the threshold "
              "the chosen k must find (default 0.99).")
@click.option("--containment", is_flag=True, help="With --min-similarity: the check is the "
              "share of the row's shingles found in the match (a short page inside a long "
              "one), not the Jaccard similarity.")
@click.option("--time-budget", type=click.FloatRange(0, min_open=True), metavar="SECONDS",
              help="With --min-similarity and no --k: cap the calibrated k so that the "
              "estimated run time fits (the summary then says the recall falls short).")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "parquet"]),
              help="Input format (default: from each file's extension).")
@click.option("--output-format", type=click.Choice(["jsonl", "csv", "parquet"]),
              help="Format of the kept rows (default: from --output's suffix, else the "
              "first input's format).")
@click.option("--jobs", "-j", type=click.IntRange(1, 256), default=None,
              help="Worker processes that read and fingerprint plain JSON lines files in "
              "parts; for other inputs, fingerprinting threads (processes for the "
              "compatibility schemes) and a reader one batch ahead (default: every core).")
@click.option("--on-error", type=click.Choice(["stop", "skip"]), default="stop",
              show_default=True, help="A bad row: stop (writing no output) or skip it.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None,
              metavar="ADDRESS", help="Run on Ray: join the cluster at ADDRESS, or with no "
              "ADDRESS start a local one. The same rows are kept; --output, --removed and "
              "--clusters are directories of part files, one per input file (needs: pip "
              "install 'simindex[ray]').")
def dedup(inputs, output, text_field, id_field, fingerprint_field, k, scheme, width,
          index_dir, against, removed, clusters_out, mode, keep, drop_all, annotate,
          min_similarity, recall, containment, time_budget, fmt, output_format, jobs, on_error,
          quiet, ray_address):
    """Write the rows of INPUTS (JSONL, CSV or Parquet, .gz too) that are not near-duplicates
    of a row kept before them to --output: in input order, a row is kept when no kept row
    is within k bits (the crawler's rule, add_unique); each removed row names the kept row
    it matched. With --index the kept rows stay indexed for later runs. INPUTS may be
    directories: their files, in name order."""
    from .datasets.run import Summary, decision_batches, few_collections
    from .datasets.settings import input_files, rows_about
    from .datasets.reports import ANNOTATIONS, DedupOutputs
    from .datasets.rows import format_of

    try:
        files = input_files(inputs)
        out_fmt = output_format or _known_format(output) or format_of(files[0], fmt)
    except Error as e:
        _fail(str(e))
    if (recall is not None or containment or time_budget is not None) and \
            min_similarity is None:
        raise click.UsageError("--recall, --containment and --time-budget need "
                               "--min-similarity")
    if ray_address is not None:
        if jobs is not None:
            raise click.UsageError("--jobs sets this machine's threads; with --ray, Ray's "
                                   "tasks share the work")
        _ray_dedup(files, output, ray_address, quiet, removed=removed, clusters=clusters_out,
                   annotate=annotate, output_format=out_fmt, text_field=text_field,
                   id_field=id_field, fingerprint_field=fingerprint_field, k=k,
                   scheme=scheme, width=None if width is None else int(width),
                   index=index_dir, against=against, mode=mode, keep=keep,
                   drop_all=drop_all, min_similarity=min_similarity, recall=recall,
                   containment=containment, time_budget=time_budget, fmt=fmt,
                   on_error=_Skips(quiet) if on_error == "skip" else "stop")
        return
    summary = Summary()
    outputs = None
    bar = _progress(quiet, unit="row")
    error = None
    try:
        if bar is not None:
            bar.total = rows_about(files, fmt)      # about: the rows are counted as read
            bar.refresh()
        outputs = DedupOutputs(output, out_fmt, removed, clusters_out, annotate, summary)
        batches = decision_batches(
            files, text_field=text_field, id_field=id_field,
            fingerprint_field=fingerprint_field, k=k, scheme=scheme,
            width=None if width is None else int(width), index=index_dir, against=against,
            fmt=fmt, mode=mode, keep=keep, drop_all=drop_all, min_similarity=min_similarity,
            recall=recall, containment=containment, time_budget=time_budget,
            jobs=jobs or os.cpu_count() or 1,
            on_error=_Skips(quiet) if on_error == "skip" else "stop", summary=summary,
            reserved=ANNOTATIONS if annotate else (),
            lines=not annotate and out_fmt == "jsonl")
        with few_collections():
            for batch in batches:
                outputs.add_all(batch)
                _advance(bar, len(batch))
        if bar is not None:
            bar.total = bar.n                      # every row read: the bar ends at 100%
        outputs.commit()
        outputs = None
    except (Error, OSError, ValueError) as e:
        error = str(e)
    finally:
        if outputs is not None:
            outputs.abort()
        if bar is not None:
            bar.close()
    if error:
        _fail(f"{error} ({summary}; no output was written)")
    if not quiet:
        click.echo(f"simindex dedup: {summary}", err=True)


def _ray_dedup(files, output, address, quiet, **options):
    """dedup --ray: simindex.distributed.dedup, its errors turned into exit 1."""
    try:
        from .distributed.connection import connect, release
        from .distributed.datasets import dedup as ray_dedup
    except ImportError as e:
        _fail(str(e))
    from .datasets.run import Summary
    summary = Summary()
    address = None if address == "local" else address
    try:
        started = connect(address)
    except (ConnectionError, RuntimeError, ValueError) as e:          # ray.init's failures
        _fail(f"cannot start or join the Ray cluster at {address or 'a new local one'}: {e}")
    try:
        ray_dedup(files, output, address=address, summary=summary, **options)
    except (Error, OSError, ValueError) as e:
        _fail(f"{e} ({summary}; no output was written)")
    finally:
        release(started)
    if not quiet:
        click.echo(f"simindex dedup: {summary}", err=True)


@cli.command(short_help="Serve INDEX over HTTP (JSON).")
@click.argument("index")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on. "
              "One that other machines reach needs a token (or --insecure).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="TCP port to listen on, at --host.")
@click.option("--workers", "-w", type=click.IntRange(1, 256), default=os.cpu_count() or 1,
              show_default="all cores", help="Worker processes; each opens the index once.")
@click.option("--token-file", type=click.Path(dir_okay=False), help="A file whose first line is "
              "the bearer token every request but /, /docs, /health and /openapi.json must carry "
              "(or set SIMINDEX_TOKEN; never on the command line).")
@click.option("--readonly", is_flag=True, help="Serve queries only; writes answer 403.")
@click.option("--max-body", type=click.IntRange(1), default=8 << 20, show_default=True,
              help="Largest request body, in bytes (413 beyond).")
@click.option("--max-batch", type=click.IntRange(1), default=10_000, show_default=True,
              help="Most fingerprints or records in one batch request (413 beyond).")
@click.option("--insecure", is_flag=True, help="Allow a non-loopback --host without a token.")
@click.option("--access-log", is_flag=True, help="Log every request (costs throughput).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info",
                                                "debug"]), default="info", show_default=True,
              help="The least severe server messages written to stderr.")
def serve(index, host, port, workers, token_file, readonly, max_body, max_batch, insecure,
          access_log, log_level):
    """Serve INDEX over HTTP (JSON) until SIGTERM or Ctrl-C: queries by fingerprint or text,
    adds, the atomic add-if-novel, removes, stats, a web page at / and go-simstore's
    GET /search?sig=. Needs the 'server' extra. See docs/tutorials/serve.md."""
    from .server.app import Settings, read_token
    from .server.run import serve as run
    try:
        token = read_token(token_file) if token_file else os.environ.get("SIMINDEX_TOKEN") or None
        settings = Settings(path=os.path.abspath(index), token=token, readonly=readonly,
                            max_body=max_body, max_batch=max_batch, workers=workers)
        run(settings, host=host, port=port, token_file=token_file, insecure=insecure,
            access_log=access_log, log_level=log_level)
    except ParameterError as e:
        raise click.UsageError(str(e)) from None
    except Error as e:
        _fail(str(e))


def _known_format(path):
    """The format a path's extension names, or None."""
    from .datasets.rows import format_of
    try:
        return format_of(path)
    except Error:
        return None


def main(argv=None):
    """Entry point; returns the exit status instead of raising SystemExit."""
    try:
        cli.main(args=argv, prog_name="simindex", standalone_mode=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except (Error, OSError) as e:      # storage trouble outside a command's own handling
        click.echo(f"simindex: error: {e}", err=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
