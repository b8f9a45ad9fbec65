"""`localspec distill`: train a draft for a model pair's target (an EAGLE / Eagle3 / MTP head or a standalone draft).

Example (the shipped head):
  localspec distill --kind eagle --out assets/drafts/smollm2-135m-eagle --tokens 0 --text-tokens 400000 --minutes 55
"""

from __future__ import annotations

import sys
from pathlib import Path

from .common import add_model_options


def add_parser(sub) -> None:
    parser = sub.add_parser("distill", help="train a draft head (eagle, eagle3, mtp) or a standalone draft model")
    add_model_options(parser)
    parser.add_argument("--kind", required=True, choices=("eagle", "eagle3", "mtp", "draft"))
    parser.add_argument("--out", required=True, help="output folder (models.yaml: head: <folder> or draft: {source})")
    parser.add_argument(
        "--prompts",
        action="append",
        default=[],
        metavar="FILE",
        help="extra prompt file (.jsonl with prompt/text/turns, or text: one per line); repeatable",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help="the shared prompt sets (default: ../shared/data next to the repository; 'none' to skip)",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=200_000,
        help="tokens of the target's own answers to generate (default: %(default)s)",
    )
    parser.add_argument(
        "--text-tokens",
        type=int,
        default=0,
        help="tokens of offline text (stdlib sources, package docs) read by teacher forcing",
    )
    parser.add_argument(
        "--stream-text",
        action="store_true",
        help="teacher-force offline text (stdlib sources, package docs) inside the training loop: "
        "fresh tokens every update at prefill speed, nothing stored",
    )
    parser.add_argument(
        "--answer-share",
        type=float,
        default=0.25,
        help="with --stream-text: share of training batches drawn from the stored answers",
    )
    parser.add_argument("--init", default=None, metavar="DIR", help="continue from this trained head folder")
    parser.add_argument(
        "--feature-layers",
        nargs="+",
        default=[],
        metavar="L",
        help="also read these target layers' outputs (EAGLE-3's multi-layer features), or 'auto' "
        "(a low, a middle and a high layer); the corpus is teacher-forced once for them",
    )
    parser.add_argument(
        "--draft-vocab",
        type=int,
        default=8192,
        help="tokens the head can propose: the most frequent in the corpus; 0 = all (default: %(default)s)",
    )
    parser.add_argument("--minutes", type=float, default=None, help="time budget (corpus gets at most half)")
    parser.add_argument("--resume", action="store_true", help="reuse the corpus and continue from the checkpoint")
    parser.add_argument("--steps", type=int, default=4, help="draft steps trained (training-time test); mtp modules")
    parser.add_argument(
        "--hard-label-weight",
        type=float,
        default=0.0,
        help="heads: weight (0-1) of cross-entropy to the target's argmax, the rest on its "
        "distribution; the argmax is what greedy acceptance checks (default: %(default)s)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=256, help="answer length when generating the corpus")
    parser.add_argument(
        "--gen-batch-size",
        type=int,
        default=32,
        help="answers generated at once when building the corpus (static KV cache, left padding)",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="training windows per update")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--max-updates", type=int, default=100_000)
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument(
        "--patience", type=int, default=4, help="stop after this many validations without a better validation loss"
    )
    parser.add_argument("--corpus", default=None, help="corpus folder (default: OUT/corpus); shared between runs")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def parse_feature_layers(values: list[str]):
    from localspec.config import ConfigError

    if values == ["auto"]:
        return "auto"
    try:
        return tuple(int(v) for v in values)
    except ValueError:
        raise ConfigError(f"--feature-layers takes layer indices or 'auto' (got {' '.join(values)})") from None


def run(args) -> int:
    import torch

    from localspec.config import ConfigError
    from localspec.distill.data import SHARED_DATA, prompt_file, training_prompts
    from localspec.distill.run import DistillOptions, distill

    from .common import load_session

    if args.threads:
        torch.set_num_threads(args.threads)
    options = DistillOptions(
        kind=args.kind,
        out=Path(args.out),
        answer_tokens=args.tokens,
        text_tokens=args.text_tokens,
        stream_text=args.stream_text,
        answer_share=args.answer_share,
        init=Path(args.init) if args.init else None,
        draft_vocab=args.draft_vocab,
        feature_layers=parse_feature_layers(args.feature_layers),
        minutes=args.minutes,
        resume=args.resume,
        steps=args.steps,
        hard_label_weight=args.hard_label_weight,
        max_new_tokens=args.max_new_tokens,
        gen_batch_size=args.gen_batch_size,
        batch_size=args.batch_size,
        lr=args.lr,
        max_updates=args.max_updates,
        eval_every=args.eval_every,
        patience=args.patience,
        corpus_dir=Path(args.corpus) if args.corpus else None,
        progress=not args.no_progress,
    ).validate()
    out = Path(args.out)
    if out.exists() and any(out.glob("*.safetensors")) and not args.resume:
        raise ConfigError(f"{out} already holds a trained model; pass --resume to continue it or pick another --out")
    data_dir = None if args.data_dir == "none" else Path(args.data_dir or SHARED_DATA)
    if data_dir is not None and not (data_dir / "mt_bench_question.jsonl").exists():
        if args.data_dir:
            raise ConfigError(f"--data-dir {data_dir} has no mt_bench_question.jsonl")
        data_dir = None
    prompts = (
        training_prompts(data_dir, tuple(args.prompts))
        if data_dir is not None
        else [p for path in args.prompts for p in prompt_file(Path(path))]
    )
    session = load_session(args, load_draft=False)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    summary = distill(session.loaded.target, session.tokenizer, prompts, options, log=log)
    log(
        f"wrote {out}: {summary['kind']}, {summary['corpus_tokens']} corpus tokens, {summary['updates']} updates "
        f"in {summary['train_minutes']:.1f} min ({summary['stop_reason']})"
    )
    if summary.get("val_agreement"):
        log("validation agreement per draft step: " + ", ".join(f"{a:.2f}" for a in summary["val_agreement"]))
    if args.kind == "draft":
        log(f"use it: models.yaml → proposers: draft: {{source: {out}}}")
    else:
        log(f"use it: models.yaml → proposers: head: {out}   (then --proposer head)")
    return 0
