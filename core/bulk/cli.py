"""``python -m core embed --input PATH --output PATH [options]``: the command line of a corpus job
(core/bulk/job.py). The model and settings come as ``serve``'s do (``--model``, ``TESSERA_*``)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from core.bulk.job import EMBEDDING_TYPES, JobError, JobOptions

RUNNERS = ("local", "ray", "modal")


def add_embed_parser(sub) -> None:
    embed = sub.add_parser(
        "embed", help="embed a corpus (Parquet, JSON Lines, CSV or text lines) into a Parquet file, resumably",
        description="Embed every row of --input with the configured model (the same engine and settings as "
                    "`serve`) into --output (Parquet: the id and the vector, with the model's identity and the "
                    "options in the file's metadata). Killed, the same command resumes; run again once "
                    "finished, it does nothing. Repeated texts are embedded once. See docs/bulk.md.")
    io = embed.add_argument_group("input and output")
    io.add_argument("--input", required=True, help="a local path, s3:// URI or, with --on modal, volume://NAME/PATH "
                    "(a file on a Modal Volume) (.parquet, .jsonl, .csv/.tsv, or "
                    "text: one text per line)")
    io.add_argument("--output", required=True, help="the Parquet file to write (local path, s3:// URI or, with "
                    "--on modal, volume://NAME/PATH)")
    _add_columns(io)
    io.add_argument("--work-dir", default=None, help="where parts are kept until the output is whole "
                    "(default OUTPUT.parts; for an s3:// output, under cache_dir): a new or empty folder, or this "
                    "job's; the job deletes only its own files there, and one job runs in it at a time")
    io.add_argument("--overwrite", action="store_true", help="redo the job even when --output is complete (an "
                    "--output naming the input is refused all the same)")
    _add_vector_options(embed)
    run = embed.add_argument_group("how it runs")
    run.add_argument("--on", default="local", choices=RUNNERS,
                     help="local: this process; ray: Ray Data (RAY_ADDRESS, else a local Ray); modal: the Modal "
                          "class (docs/bulk.md)")
    run.add_argument("--rows-per-part", type=int, default=8192, help="rows per part file (what a resume redoes "
                     "at most)")
    run.add_argument("--request-texts", type=int, default=64, help="texts per engine request")
    run.add_argument("--concurrency", type=int, default=16, help="engine requests in flight")
    run.add_argument("--actors", type=int, default=None, help="--on ray: model copies (default: one per GPU, else "
                     "one per `threads` CPUs)")
    run.add_argument("--modal-app", default="tessera", help="--on modal: the deployed app's name (default tessera)")
    run.add_argument("--shard-size", type=int, default=2048, help="--on modal: texts per embed_shard call")
    run.add_argument("--threads", default=None, help="runtime threads (env TESSERA_THREADS)")
    run.add_argument("--cache-dir", default=None, help="export cache (env TESSERA_CACHE_DIR)")
    run.add_argument("--embedding-cache", default=None,
                     help="a shared cache the job reads and fills too: memory | redis://... (env TESSERA_EMBEDDING_CACHE)")


def _add_columns(group) -> None:
    group.add_argument("--format", default="auto", help="auto (from the name) | parquet | jsonl | csv | text")
    group.add_argument("--text-column", default="text", help="the column (field) holding the text (default text)")
    group.add_argument("--id-column", default=None, help="the column holding each row's id (default: the row number)")


def _add_vector_options(parser) -> None:
    vec = parser.add_argument_group("what changes the vectors (as /v1/embeddings' options)")
    vec.add_argument("--model", action="append", default=[], metavar="PATH[:NAME] | path=PATH,KEY=VALUE,...",
                     help="the model, as `serve --model` (default: TESSERA_MODELS / TESSERA_CONFIG, else the "
                          "embedded all-MiniLM-L6-v2)")
    vec.add_argument("--model-name", default=None, help="which configured model, when several are")
    vec.add_argument("--backend", default=None, help="backend for --model (default auto)")
    vec.add_argument("--revision", default=None, help="Hub revision for --model")
    vec.add_argument("--dimensions", type=int, default=None, help="Matryoshka: keep the first N dimensions")
    vec.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                     help="L2-normalize (default: the model's own)")
    vec.add_argument("--prompt", default=None, help="literal text put before every text")
    vec.add_argument("--prompt-name", default=None, help="one of the model's named prompts")
    vec.add_argument("--no-truncate", dest="truncate", action="store_false",
                     help="refuse (fail the job on) texts longer than the model's length instead of cutting them")
    vec.add_argument("--embedding-type", default="float", choices=EMBEDDING_TYPES,
                     help="float32 vectors, or quantized (int8, uint8, binary, ubinary)")
    vec.add_argument("--chunking", default=None, metavar="off | on | SIZE[,OVERLAP]",
                     help="long texts in windows of SIZE tokens overlapping by OVERLAP, one vector per text "
                          "(default: the model's spec)")


def add_batch_transform_parser(sub) -> None:
    """``batch-transform prepare`` / ``collect``: SageMaker Batch Transform with the job's formats
    (core/bulk/batch_transform.py)."""
    bt = sub.add_parser(
        "batch-transform", help="SageMaker Batch Transform with the embed job's formats: prepare its JSON Lines "
        "input from a corpus, collect its .out files into the job's Parquet",
        description="prepare: the corpus as the JSON Lines records the SageMaker container takes (one request "
                    "per line, the id kept), plus a manifest; collect: the transform job's .out files back "
                    "into the Parquet file `python -m core embed` writes for that corpus. See docs/bulk.md.")
    steps = bt.add_subparsers(dest="batch_command", required=True, metavar="{prepare,collect}")
    prep = steps.add_parser("prepare", help="write the transform job's input records and the manifest",
                            description="Write OUTPUT/records/part-NNNNN.jsonl (the transform job's S3Uri: "
                            "SplitType=Line, application/jsonlines) and OUTPUT/tessera-batch.json (for collect). "
                            "The model is loaded once here, for its identity: the one the container serves.")
    io = prep.add_argument_group("input and output")
    io.add_argument("--input", required=True, help="the corpus: a local path or s3:// URI (as embed's)")
    io.add_argument("--output", required=True, help="a folder (local or s3:// prefix) for records/ and the manifest")
    _add_columns(io)
    io.add_argument("--records-per-file", type=int, default=100_000, help="records per input file (default "
                    "100000); Batch Transform spreads files over instances")
    _add_vector_options(prep)
    prep.add_argument("--threads", default=None, help="runtime threads (env TESSERA_THREADS)")
    prep.add_argument("--cache-dir", default=None, help="export cache (env TESSERA_CACHE_DIR)")
    col = steps.add_parser("collect", help="the transform job's .out files into the embed job's Parquet",
                           description="Pair line i of each RESULTS/part-NNNNN.jsonl.out with line i of the "
                           "prepared records file (or, with JoinSource=Input, check the joined record), and "
                           "write --output as `python -m core embed` does: ids, vectors, model identity and "
                           "options in the metadata.")
    col.add_argument("--prepared", required=True, help="the folder `prepare` wrote (local or s3://)")
    col.add_argument("--results", required=True, help="the transform job's S3OutputPath (local or s3://), "
                     "holding part-NNNNN.jsonl.out")
    col.add_argument("--output", required=True, help="the Parquet file to write (local path or s3:// URI)")
    col.add_argument("--work-dir", default=None, help="where parts are kept until the output is whole")
    col.add_argument("--overwrite", action="store_true", help="write --output even when it is complete")
    col.add_argument("--cache-dir", default=None, help="(env TESSERA_CACHE_DIR) holds the work folder of an "
                     "s3:// output")
    col.set_defaults(model=[])


def run_batch_transform(args: argparse.Namespace, settings) -> int:
    from core.bulk import batch_transform
    from core.errors import TesseraError
    from core.logs import configure_logging

    configure_logging("warning" if settings.log_level == "info" else settings.log_level, fmt=settings.log_format)
    try:
        if args.batch_command == "prepare":
            options = JobOptions(input=args.input, output=args.output, format=args.format,
                                 text_column=args.text_column, id_column=args.id_column, model=args.model_name,
                                 dimensions=args.dimensions, normalize=args.normalize, prompt=args.prompt,
                                 prompt_name=args.prompt_name, truncate=args.truncate,
                                 embedding_type=args.embedding_type, chunking=chunking_value(args.chunking))
            lines = asyncio.run(batch_transform.prepare(settings, options, args.output, args.records_per_file)).lines()
        else:
            summary = batch_transform.collect(settings, args.prepared, args.results, args.output,
                                              overwrite=args.overwrite, work_dir=args.work_dir)
            lines = (summary.lines()[:1] if summary.already_complete else
                     [f"rows: {summary.rows} ({summary.rows_this_run} this run, {summary.resumed_from} done before)",
                      f"output: {summary.output}"])
    except TesseraError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    for line in lines:
        print(line, flush=True)
    return 0


def chunking_value(text: str | None):
    if text is None:
        return None
    lowered = text.strip().lower()
    if lowered in ("off", "false", "no"):
        return False
    if lowered in ("on", "true", "yes"):
        return True
    size, _, overlap = lowered.partition(",")
    try:
        return {"size": int(size), "overlap": int(overlap or 0)}
    except ValueError:
        raise JobError(f"--chunking {text!r}: expected off, on, or SIZE[,OVERLAP] in tokens") from None


def options_from_args(args: argparse.Namespace) -> JobOptions:
    return JobOptions(
        input=args.input, output=args.output, format=args.format, text_column=args.text_column,
        id_column=args.id_column, model=args.model_name, dimensions=args.dimensions, normalize=args.normalize,
        prompt=args.prompt, prompt_name=args.prompt_name, truncate=args.truncate,
        embedding_type=args.embedding_type, chunking=chunking_value(args.chunking),
        rows_per_part=args.rows_per_part, request_texts=args.request_texts, concurrency=args.concurrency,
        work_dir=args.work_dir, overwrite=args.overwrite)


def run_embed(args: argparse.Namespace, settings) -> int:
    """The ``embed`` command with ``settings`` parsed at the edge; the summary on stdout."""
    from core.bulk import formats
    from core.bulk.progress import Progress
    from core.errors import TesseraError
    from core.logs import configure_logging

    configure_logging("warning" if settings.log_level == "info" else settings.log_level, fmt=settings.log_format)
    try:
        options = options_from_args(args)
        if args.on != "modal":
            from core.bulk.modal_volume import refuse_off_modal

            refuse_off_modal(options, args.on)
        if args.on == "ray":
            from core.bulk.ray_runner import run_ray

            summary = run_ray(settings, options, actors=args.actors)
        elif args.on == "modal":
            from core.bulk.modal_runner import run_modal

            summary = run_modal(settings, options, app_name=args.modal_app, shard_size=args.shard_size)
        else:
            from core.bulk.job import run_local

            progress = Progress(total=formats.input_rows(options.input))
            summary = asyncio.run(run_local(settings, options, progress))
    except TesseraError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    for line in summary.lines():
        print(line, flush=True)
    return 0
