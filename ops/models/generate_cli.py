"""`tokenmill generate`: prompts straight through the engine, no Kafka."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from ops.models.engine_options import build_engine, engine_choice, engine_options


def read_prompts(prompts: tuple[str, ...], prompt_file: Path | None) -> list[str]:
    lines = list(prompts)
    if prompt_file is not None:
        text = sys.stdin.read() if str(prompt_file) == "-" else prompt_file.read_text("utf-8")
        lines.extend(line for line in text.splitlines() if line.strip())
    if not lines:
        raise click.UsageError("give --prompt TEXT (repeatable) or --prompt-file FILE")
    return lines


@click.command()
@engine_options
@click.option("--prompt", "-p", "prompts", multiple=True, help="A prompt; repeat for several.")
@click.option(
    "--prompt-file",
    type=click.Path(path_type=Path, exists=True, dir_okay=False, allow_dash=True),
    default=None,
    help="One prompt per line ('-' reads stdin).",
)
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 is greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=0, show_default=True, help="0 disables top-k.")
@click.option("--seed", type=int, default=None, help="Makes sampling reproducible.")
@click.option("--stop", multiple=True, help="Stop string; repeatable.")
@click.option("--ignore-eos", is_flag=True, help="Generate exactly --max-new-tokens.")
@click.option(
    "--chat", is_flag=True, help="Wrap each prompt as a user message in the chat template."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON line per prompt, in input order.")
def generate(**kwargs: Any) -> None:
    """Run prompts through the engine in one continuous batch and print the outputs.

    Prints each prompt's completion and, on stderr, the token throughput.
    """
    from gpu.engine import EngineRequest
    from gpu.errors import RequestRejected
    from gpu.sequence import SamplingParams
    from ops.models.offline import run_all

    choice = engine_choice(kwargs)
    prompts = read_prompts(kwargs["prompts"], kwargs["prompt_file"])
    engine = build_engine(choice)
    tokenizer = engine.model.tokenizer
    if kwargs["chat"]:
        if not tokenizer.chat_template:
            raise click.ClickException(f"model {choice.model} has no chat template")
        try:
            texts = [
                tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in prompts
            ]
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
        token_ids = tokenizer.encode_batch(texts, add_special_tokens=False)
    else:
        token_ids = tokenizer.encode_batch(prompts)
    params = SamplingParams(
        max_new_tokens=kwargs["max_new_tokens"],
        temperature=kwargs["temperature"],
        top_p=kwargs["top_p"],
        top_k=kwargs["top_k"],
        seed=kwargs["seed"],
        stop=tuple(kwargs["stop"]),
        ignore_eos=kwargs["ignore_eos"],
    )
    requests = [EngineRequest(str(i), ids, params) for i, ids in enumerate(token_ids)]
    try:
        run = run_all(engine, requests)
    except RequestRejected as exc:
        raise click.ClickException(f"{exc.code}: {exc}") from exc

    for prompt, completion in zip(prompts, run.completions, strict=True):
        if kwargs["as_json"]:
            line = {
                "prompt": prompt,
                "token_ids": completion.token_ids,
                "text": completion.text,
                "finish_reason": completion.finish_reason,
            }
            click.echo(json.dumps(line, ensure_ascii=False))
        else:
            click.secho(f"▶ {prompt}", bold=True)
            click.echo(
                f"{completion.text.strip()}\n  [{completion.finish_reason}, "
                f"{len(completion.token_ids)} tokens]\n"
            )
    wall = max(run.wall_s, 1e-9)
    quantization = getattr(engine.model, "quantization", "none")
    held = "" if quantization == "none" else f", {quantization}"
    click.echo(
        f"{len(prompts)} prompts · {run.prompt_tokens} prompt tokens · {run.output_tokens} "
        f"generated in {wall:.2f} s · {run.output_tokens / wall:.1f} generated tok/s · "
        f"{(run.prompt_tokens + run.output_tokens) / wall:.1f} total tok/s · model "
        f"{engine.model.name} ({engine.model.digest[:19]}{held})",
        err=True,
    )
