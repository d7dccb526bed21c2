"""One cold start, measured from inside: `python -m ops.bench.startup_probe MODEL` imports
torch, then the engine's code, loads MODEL (`gpu.loading.loader.load_model`'s own phases),
builds the engine and runs one token, and prints the seconds of each as one JSON object.
`bench startup` runs it in fresh processes: a warm interpreter would hide the imports."""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    begun = time.perf_counter()
    seconds: dict[str, float] = {}
    last = begun

    def lap(phase: str) -> None:
        nonlocal last
        now = time.perf_counter()
        seconds[phase] = round(now - last, 3)
        last = now

    import torch  # noqa: F401  # timed on its own: most of any start-up

    lap("import_torch")
    from gpu.engine import EngineRequest
    from gpu.sequence import SamplingParams
    from ops.models.engine_options import EngineChoice, build_engine
    from ops.models.registry import resolve_model

    lap("import_tokenmill")
    resolve_model(sys.argv[1])
    lap("resolve")
    engine = build_engine(EngineChoice(model=sys.argv[1]))
    loaded = time.perf_counter()
    load_s = dict(engine.model.load_s)
    seconds |= {f"load_{phase}": s for phase, s in load_s.items()}
    seconds["engine"] = round(loaded - last - sum(load_s.values()), 3)
    last = loaded
    prompt = engine.model.tokenizer.encode_batch(["Hello"])[0]
    engine.add(EngineRequest("probe", prompt, SamplingParams(max_new_tokens=1)))
    while engine.has_work():
        engine.step()
    lap("first_token")
    seconds["total"] = round(time.perf_counter() - begun, 3)
    print(json.dumps(seconds))


if __name__ == "__main__":
    main()
