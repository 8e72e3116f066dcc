#!/usr/bin/env python3
"""Writes tests/data/sft/goldens.json: the ids and loss masks tools/data/prepare-sft must give,
computed with transformers' own tokenizer (AutoTokenizer.from_pretrained + apply_chat_template),
not with prepare-sft's code.

    tests/data/make_sft_goldens.py [--check]

For each fixture tokenizer (tests/data/make_sft_fixtures.py) and input file, and for
--train-on assistant and last-assistant, one entry per input line: the ids and mask, or why the
conversation is dropped. The mask rules are docs/fine-tuning.md's, written here in transformers'
terms:
  * a template with {% generation %} blocks: apply_chat_template(..., return_dict=True,
    return_assistant_tokens_mask=True)'s assistant_masks; with last-assistant or a
    prompt/completion record, only from the tokens of the conversation before the trained
    messages on;
  * another template: for each trained stretch of messages [s, e), the tokens of
    apply_chat_template(messages[:e]) beyond those of apply_chat_template(messages[:s],
    add_generation_prompt=True), up to the stretch's last special token (where the tokenizer
    merges text across that boundary, the tokens overlapping the stretch's characters); before
    message 0, where the template cannot render no messages, apply_chat_template(messages[:1])
    up to message 0's content stands for the first of those;
  * two strings: tokenizer(prompt) + tokenizer(completion, add_special_tokens=False) + [eos],
    the completion and eos trained;
  * a language-modeling record {"text"}: TRL's SFTTrainer rule, tokenizer(text + eos_token)
    (text alone when it already ends with eos_token), every token trained;
  * a record's chat_template_kwargs go to every apply_chat_template call of it.
--check recomputes and compares with the file instead of writing it (check_prepare_sft.py does
the same when transformers is installed). Needs transformers (no torch), tokenizers and jinja2.
"""
import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SFT = os.path.join(HERE, "sft")
GOLDENS = os.path.join(SFT, "goldens.json")
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "system": "system"}

# Which inputs each fixture tokenizer prepares (SmolLM3's template writes today's date unless the
# system message says /system_override, so it has its own input file).
CASES = [(tokenizer, data) for tokenizer in ("llama3", "qwen2.5", "chatml-generation")
         for data in ("chat.jsonl", "prompt_completion.jsonl", "sharegpt.jsonl")]
CASES += [("smollm3", "smollm3.jsonl")]
# Conversations that open with the assistant's message (greeting-first data); the generation
# template refuses them by design (check_prepare_sft.py's errors check that).
CASES += [(tokenizer, "assistant_first.jsonl") for tokenizer in ("llama3", "qwen2.5")]
# Language-modeling text records, mixed with a chat record.
CASES += [(tokenizer, "text.jsonl") for tokenizer in ("llama3", "qwen2.5", "chatml-generation")]
# Llama 3.1's ipython role (a tool's output), with Llama 3's template.
CASES += [("llama3", "ipython.jsonl")]
# chat_template_kwargs: SmolLM3's enable_thinking, false on every record but the last.
CASES += [("smollm3", "smollm3_kwargs.jsonl")]
# --chat-template FILE: Llama 3's tokenizer with the {% generation %} ChatML template (a base
# model's tokenizer given a template; <|im_start|> is plain text to it).
TEMPLATE_CASES = [("llama3", "chat.jsonl", "chatml-generation/chat_template.jinja")]
TRAIN_ON = ("assistant", "last-assistant")


def load_tokenizer(directory):
    import logging
    import transformers
    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return transformers.AutoTokenizer.from_pretrained(directory)


def chat_ids(tok, messages, **kwargs):
    return tok.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)


def before_text(tok, messages, start, **kwargs):
    """The text before trained message `start`: apply_chat_template(messages[:start],
    add_generation_prompt=True), or, before message 0 where the template cannot render an empty
    conversation (Qwen2.5's), message 0's own render up to its content."""
    try:
        return tok.apply_chat_template(messages[:start], tokenize=False, add_generation_prompt=True,
                                       **kwargs)
    except Exception:
        if start > 0:
            raise
    own = tok.apply_chat_template(messages[:1], tokenize=False, **kwargs)
    content = messages[0]["content"]
    # A template may trim the content (Llama 3's `| trim`): then its stripped text is what the
    # render holds.
    at = own.rfind(content)
    return own[:at if at >= 0 else own.rindex(content.strip())]


def before_ids(tok, messages, start, **kwargs):
    try:
        return chat_ids(tok, messages[:start], add_generation_prompt=True, **kwargs)["input_ids"]
    except Exception:
        if start > 0:
            raise
    return tok(before_text(tok, messages, 0, **kwargs), add_special_tokens=False)["input_ids"]


def golden(tok, record, train_on, template=None):
    """(ids, mask) of one record, or the reason it is dropped; `template`: the text of a chat
    template to use instead of the tokenizer's (apply_chat_template(chat_template=...))."""
    if "text" in record:
        text = record["text"]
        if not text:
            return "empty"
        ids = tok(text if text.endswith(tok.eos_token) else text + tok.eos_token)["input_ids"]
        return ids, [1] * len(ids)
    if isinstance(record.get("prompt"), str):
        prompt_ids = tok(record["prompt"])["input_ids"]
        completion_ids = tok(record["completion"], add_special_tokens=False)["input_ids"]
        completion_ids = completion_ids + [tok.eos_token_id]
        return prompt_ids + completion_ids, [0] * len(prompt_ids) + [1] * len(completion_ids)
    first_trained = None
    # TRL passes a record's chat_template_kwargs to apply_chat_template.
    kwargs = dict(record.get("chat_template_kwargs") or {})
    if template is not None:
        kwargs["chat_template"] = template
    if "messages" in record:
        messages = record["messages"]
    elif "conversations" in record:
        messages = [{"role": ROLES[t["from"]], "content": t["value"]} for t in record["conversations"]]
    else:
        messages = record["prompt"] + record["completion"]
        first_trained = len(record["prompt"])
    if not messages:
        return "empty"
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if first_trained is not None:
        regions = [(first_trained, len(messages))]
    elif train_on == "last-assistant":
        regions = [(assistants[-1], assistants[-1] + 1)] if assistants else []
    else:
        regions = [(i, i + 1) for i in assistants]
    if re.search(r"\{\%-?\s*generation\s*-?\%\}", template or tok.get_chat_template()):
        out = chat_ids(tok, messages, return_assistant_tokens_mask=True, **kwargs)
        ids, mask = out["input_ids"], list(out["assistant_masks"])
        if (first_trained is not None or train_on == "last-assistant") and regions:
            start = regions[0][0]
            boundary = len(chat_ids(tok, messages[:start], **kwargs)["input_ids"]) if start else 0
            mask = [0] * boundary + mask[boundary:]
        elif not regions:
            mask = [0] * len(ids)
    else:
        ids = chat_ids(tok, messages, **kwargs)["input_ids"]
        mask = [0] * len(ids)
        for start, end in regions:
            before = before_ids(tok, messages, start, **kwargs)
            through = chat_ids(tok, messages[:end], **kwargs)["input_ids"]
            if ids[:len(before)] == before and ids[:len(through)] == through:
                first, last = len(before), len(through)
            else:
                # The tokenizer merged across the boundary: the tokens overlapping the characters
                # the stretch adds.
                text = lambda m, **kw: tok.apply_chat_template(m, tokenize=False, **kwargs, **kw)
                lo = len(before_text(tok, messages, start, **kwargs))
                hi = len(text(messages[:end]))
                offsets = tok(text(messages), add_special_tokens=False,
                              return_offsets_mapping=True)["offset_mapping"]
                marked = [t for t, (a, b) in enumerate(offsets) if a < hi and b > lo]
                first, last = marked[0], marked[-1] + 1
            special = [t for t in range(first, last)
                       if ids[t] in tok.added_tokens_decoder and tok.added_tokens_decoder[ids[t]].special]
            if special:
                last = special[-1] + 1
            mask[first:last] = [1] * (last - first)
    if sum(mask[1:]) == 0:
        return "no_loss_token"
    return ids, mask


def compute():
    import tokenizers
    import transformers
    out = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
           "cases": []}
    for name, data, template_file in [c + (None,) for c in CASES] + TEMPLATE_CASES:
        tok = load_tokenizer(os.path.join(SFT, name))
        with open(os.path.join(SFT, data), encoding="utf-8") as f:
            records = [(n, json.loads(line)) for n, line in enumerate(f, 1) if line.strip()]
        template = None
        if template_file is not None:
            with open(os.path.join(SFT, template_file), encoding="utf-8") as f:
                template = f.read()
        for train_on in TRAIN_ON:
            entries = []
            for number, record in records:
                result = golden(tok, record, train_on, template)
                if isinstance(result, str):
                    entries.append({"line": number, "dropped": result})
                else:
                    ids, mask = result
                    entries.append({"line": number, "ids": ids,
                                    "mask": "".join(str(m) for m in mask)})
            case = {"tokenizer": name, "input": data, "train_on": train_on}
            if template_file is not None:
                case["chat_template"] = template_file
            case["conversations"] = entries
            out["cases"].append(case)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare with goldens.json, write nothing")
    args = p.parse_args()
    goldens = compute()
    if args.check:
        with open(GOLDENS, encoding="utf-8") as f:
            committed = json.load(f)
        if committed["cases"] != goldens["cases"]:
            sys.exit("make_sft_goldens: transformers %s disagrees with goldens.json (made with %s)"
                     % (goldens["transformers"], committed["transformers"]))
        print("make_sft_goldens: goldens.json agrees with transformers %s" % goldens["transformers"])
        return
    with open(GOLDENS, "w", encoding="utf-8") as f:
        # One conversation per line keeps the file reviewable.
        f.write('{"transformers": %s, "tokenizers": %s, "cases": [\n'
                % (json.dumps(goldens["transformers"]), json.dumps(goldens["tokenizers"])))
        for c, case in enumerate(goldens["cases"]):
            template = (', "chat_template": %s' % json.dumps(case["chat_template"])
                        if "chat_template" in case else "")
            f.write(' {"tokenizer": %s, "input": %s, "train_on": %s%s, "conversations": [\n'
                    % (json.dumps(case["tokenizer"]), json.dumps(case["input"]),
                       json.dumps(case["train_on"]), template))
            f.write(",\n".join("  " + json.dumps(e) for e in case["conversations"]))
            f.write("\n ]}%s\n" % ("," if c + 1 < len(goldens["cases"]) else ""))
        f.write("]}\n")
    print("make_sft_goldens: wrote %s (%d cases, transformers %s)"
          % (GOLDENS, len(goldens["cases"]), goldens["transformers"]))


if __name__ == "__main__":
    main()
