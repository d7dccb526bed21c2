"""vLLM's side of `tokenmill bench embed --vllm-python PY`, run by that interpreter (one with
vLLM installed; tokenmill is not importable there, so this file imports only the standard
library, numpy and vLLM).

    PY embed_vllm_child.py '{"model": FOLDER, "max_model_len": 2048}'

Loads the folder as a pooling model, says `{"ready": …}` on its stdout, then for each command
line on stdin, `{"texts": FILE.json, "out": FILE.npy}`, embeds the texts and saves the vectors
([texts, dims] float32), answering `{"done": N}`; `{"quit": true}` or EOF ends it. Everything
vLLM prints goes to stderr, so stdout carries only the answers.
"""

import json
import os
import sys
import time


def main() -> None:
    config = json.loads(sys.argv[1])
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM's logs (and its engine process's) to stderr

    import numpy as np
    import vllm

    start = time.perf_counter()
    common = {"model": config["model"], "dtype": "float32", "seed": 0,
              "max_model_len": config["max_model_len"]}  # fmt: skip
    try:
        llm = vllm.LLM(runner="pooling", **common)
    except TypeError:  # older vLLM: the task names the runner
        llm = vllm.LLM(task="embed", **common)
    ready = {"ready": True, "load_s": round(time.perf_counter() - start, 1)}
    answers.write(json.dumps({**ready, "version": vllm.__version__}) + "\n")
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("quit"):
            break
        with open(command["texts"]) as f:
            texts = json.load(f)
        outputs = llm.embed(texts, use_tqdm=False)
        vectors = np.array([o.outputs.embedding for o in outputs], dtype=np.float32)
        np.save(command["out"], vectors)
        answers.write(json.dumps({"done": len(outputs)}) + "\n")
    answers.close()
    try:  # its engine and worker processes outlive an exit that skips this
        llm.llm_engine.engine_core.shutdown()
    finally:
        os._exit(0)  # vLLM's atexit hooks can hang


if __name__ == "__main__":  # vLLM spawns its engine process: the guard is needed
    main()
