"""Does a testbed's model still answer after in-context retain pairs, or copy their answers? (issue 19's J_ICR)

    python benchmarks/bench_icr_copying.py --testbed runs/mini/stages/testbed-*/testbed [--max-examples 3]

For every forget row of the testbed: the split's own question (a trained LACUNA template, so the plain setting
is the fact's extractability), then the same question after 1 .. ``--max-examples`` retain QA pairs of other
people (the ICR prompt of the lm-eval tasks and of the build's robustness test, ``pick_icr_examples``). Greedy
generations judged by the tasks' default judge. ``--show N`` prints N generations per setting. Prints, per number of examples, the forget rows answered and
the rows whose generation is one of the in-context examples' answers instead (copying), and the prompt lengths in
tokens next to the model's training row length (``seq_len`` in the testbed manifest).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--testbed", type=Path, required=True, help="a built testbed (model/, data/, manifest.json)")
    parser.add_argument("--max-examples", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--show", type=int, default=0, help="print this many generations per number of examples")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lacuna_metrics import greedy_generate
    from lacuna_tasks import DEFAULT_JUDGE, get_field, judge_hit, load_data, pick_icr_examples, probe_prompt

    model_dir = args.testbed / "model"
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, trust_remote_code=False).eval()
    seq_len = json.loads((args.testbed / "manifest.json").read_text())["config"]["seq_len"]
    data = load_data(args.testbed / "data")
    forget = data.rows("forget")

    print(f"{args.testbed}: {len(forget)} forget rows, judge {DEFAULT_JUDGE}, training rows of {seq_len} tokens")
    print("| in-context retain pairs | answered | copied an example's answer | prompt tokens (max) |")
    print("|---|---|---|---|")
    for k in range(args.max_examples + 1):
        prompts, answers, fields, example_answers = [], [], [], []
        for row in forget:
            key = get_field(row["field"]).key
            examples = pick_icr_examples(data.rows("retain", key), row["ID"], key, 0, k) if k else []
            prompts.append(probe_prompt(row["question"], examples))
            answers.append(row["answer"])
            fields.append(key)
            example_answers.append([a for _, a in examples])
        generations = greedy_generate(model, tokenizer, prompts, judge=DEFAULT_JUDGE)
        answered = sum(judge_hit(DEFAULT_JUDGE, a, g, f) for a, g, f in zip(answers, generations, fields, strict=True))
        copied = sum(
            any(judge_hit(DEFAULT_JUDGE, e, g, f) for e in ex)
            for ex, g, f in zip(example_answers, generations, fields, strict=True)
        )
        longest = max(len(tokenizer(p)["input_ids"]) for p in prompts)
        print(f"| {k} | {answered}/{len(forget)} | {copied}/{len(forget)} | {longest} |")
        for answer, generation, ex in list(zip(answers, generations, example_answers, strict=True))[: args.show]:
            print(f"    answer {answer!r}, generated {generation!r}, in-context answers {ex}")


if __name__ == "__main__":
    main()
