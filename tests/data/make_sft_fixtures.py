#!/usr/bin/env python3
"""Builds the small Hugging Face tokenizer directories that test tools/data/prepare-sft.

    tests/data/make_sft_fixtures.py [--out tests/data/sft]

No Hub access is needed: each tokenizer is a byte-level BPE (vocabulary ~500) trained here on
the repository's own README.md and docs/ (as of a fixed commit, so a rerun gives the same
files), with the pre-tokenizer and the special tokens of the
model family it stands in for, saved with tokenizer.json + tokenizer_config.json (+
chat_template.jinja) as transformers lays a tokenizer out:

  llama3/             Llama-3 style: <|begin_of_text|> ... <|eot_id|> appended after the BPE
                      vocabulary, a post-processor that prepends <|begin_of_text|> (so a tool
                      that forgets add_special_tokens=False gets a second BOS), no pad token,
                      and Meta-Llama-3-8B-Instruct's published chat template.
  qwen2.5/            Qwen2.5 style: NFC, Qwen's split regex, <|endoftext|> <|im_start|>
                      <|im_end|>, tokenizer_class Qwen2Tokenizer (transformers v5 rebuilds the
                      pipeline from that class, so this also checks our tokenizer.json reading
                      agrees with it), and Qwen2.5-Instruct's published chat template.
  chatml-generation/  the Qwen2.5 tokenizer with a small ChatML template of our own that marks
                      the assistant's text with {% generation %} blocks, in chat_template.jinja
                      (the transformers v5 file), and raises on a conversation that does not
                      start with a system or user message.
  smollm3/            the same tokenizer (plus <think> </think>) with SmolLM3-3B's published
                      template, which wraps each whole assistant turn in {% generation %}.

The published templates are the models' own (data, not code of ours); SmolLM3's indentation
may differ from the Hub file, which changes nothing it renders (every tag there trims).
The output is committed; rerun this script only to change the fixtures, then rerun
tests/data/make_sft_goldens.py.
"""
import argparse
import json
import os
import shutil
import subprocess

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

# The commit whose README.md and docs/*.md the tokenizers are trained on.
CORPUS_REV = "58f2aec4f7367a1382a5b82622591d6c8f968c41"

# The split regexes of the two families (Llama-3 groups up to three digits, Qwen one).
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Meta-Llama-3-8B-Instruct's tokenizer_config.json chat_template.
LLAMA3_TEMPLATE = r"""{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"""

# Qwen2.5-Instruct's tokenizer_config.json chat_template.
QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# Ours: ChatML whose assistant text and <|im_end|> are a {% generation %} block; the newline
# between turns is not.
GENERATION_TEMPLATE = r"""{%- if messages[0].role not in ['system', 'user'] %}
    {{- raise_exception('Conversations must start with a system or user message, not ' + messages[0].role) }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' }}
        {%- generation %}
            {{- message.content + '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# SmolLM3-3B's chat_template.jinja.
SMOLLM3_TEMPLATE = r"""{# ───── defaults ───── #}
{%- if enable_thinking is not defined -%}
{%- set enable_thinking = true -%}
{%- endif -%}

{# ───── reasoning mode ───── #}
{%- if enable_thinking -%}
{%- set reasoning_mode = "/think" -%}
{%- else -%}
{%- set reasoning_mode = "/no_think" -%}
{%- endif -%}

{# ───── header (system message) ───── #}
{{- "<|im_start|>system\n" -}}

{%- if messages[0].role == "system" -%}
{%- set system_message = messages[0].content -%}
{%- if "/no_think" in system_message -%}
{%- set reasoning_mode = "/no_think" -%}
{%- elif "/think" in system_message -%}
{%- set reasoning_mode = "/think" -%}
{%- endif -%}
{%- set custom_instructions = system_message.replace("/no_think", "").replace("/think", "").rstrip() -%}
{%- endif -%}

{%- if "/system_override" in system_message -%}
{{- custom_instructions.replace("/system_override", "").rstrip() -}}
{{- "<|im_end|>\n" -}}
{%- else -%}
{{- "## Metadata\n\n" -}}
{{- "Knowledge Cutoff Date: June 2025\n" -}}
{%- set today = strftime_now("%d %B %Y") -%}
{{- "Today Date: " ~ today ~ "\n" -}}
{{- "Reasoning Mode: " + reasoning_mode + "\n\n" -}}

{{- "## Custom Instructions\n\n" -}}
{%- if custom_instructions -%}
{{- custom_instructions + "\n\n" -}}
{%- elif reasoning_mode == "/think" -%}
{{- "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role as an assistant involves thoroughly exploring questions through a systematic thinking process before providing the final precise and accurate solutions. This requires engaging in a comprehensive cycle of analysis, summarizing, exploration, reassessment, reflection, backtracking, and iteration to develop well-considered thinking process. Please structure your response into two main sections: Thought and Solution using the specified format: <think> Thought section </think> Solution section. In the Thought section, detail your reasoning process in steps. Each step should include detailed considerations such as analysing questions, summarizing relevant findings, brainstorming new ideas, verifying the accuracy of the current steps, refining any errors, and revisiting previous steps. In the Solution section, based on various attempts, explorations, and reflections from the Thought section, systematically present the final solution that you deem correct. The Solution section should be logical, accurate, and concise and detail necessary steps needed to reach the conclusion.\n\n" -}}
{%- else -%}
{{- "You are a helpful AI assistant named SmolLM, trained by Hugging Face.\n\n" -}}
{%- endif -%}

{%- if xml_tools or python_tools -%}
{{- "### Tools\n\n" -}}
{%- if xml_tools -%}
  {%- set ns = namespace(xml_tool_string="You may call one or more functions to assist with the user query.\nYou are provided with function signatures within <tools></tools> XML tags:\n\n<tools>\n") -%}
  {%- for tool in xml_tools[:] -%} {# The slicing makes sure that xml_tools is a list #}
    {%- set ns.xml_tool_string = ns.xml_tool_string ~ (tool | string) ~ "\n" -%}
  {%- endfor -%}
  {%- set xml_tool_string = ns.xml_tool_string + "</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>" -%}
  {{- xml_tool_string -}}
{%- endif -%}
{%- if python_tools -%}
  {%- set ns = namespace(python_tool_string="When you send a message containing Python code between '<code>' and '</code>' tags, it will be executed in a stateful Jupyter notebook environment, and you will then be given the output to continued reasoning in an agentic loop.\n\nYou can use the following tools in your python code like regular functions:\n<tools>\n") -%}
  {%- for tool in python_tools[:] -%} {# The slicing makes sure that python_tools is a list #}
    {%- set ns.python_tool_string = ns.python_tool_string ~ (tool | string) ~ "\n" -%}
  {%- endfor -%}
  {%- set python_tool_string = ns.python_tool_string + "</tools>\n\nThe state persists between code executions: so variables that you define in one step are still available thereafter." -%}
  {{- python_tool_string -}}
{%- endif -%}
{{- "\n\n" -}}
{{- "<|im_end|>\n" -}}
{%- endif -%}
{%- endif -%}
{# ───── main loop ───── #}
{%- for message in messages -%}
{%- set content = message.content if message.content is string else "" -%}
{%- if message.role == "user" -%}
    {{ "<|im_start|>" + message.role + "\n"  + content + "<|im_end|>\n" }}
{%- elif message.role == "assistant" -%}
    {% generation %}
    {%- if reasoning_mode == "/think" -%}
        {{ "<|im_start|>assistant\n" + content.lstrip("\n") + "<|im_end|>\n" }}
    {%- else -%}
        {{ "<|im_start|>assistant\n" + "<think>\n\n</think>\n" + content.lstrip("\n") + "<|im_end|>\n" }}
    {%- endif -%}
    {% endgeneration %}
{%- elif message.role == "tool" -%}
{{ "<|im_start|>" + "user\n"  + content + "<|im_end|>\n" }}
{%- endif -%}
{%- endfor -%}
{# ───── generation prompt ───── #}
{%- if add_generation_prompt -%}
{%- if reasoning_mode == "/think" -%}
    {{ "<|im_start|>assistant\n" }}
{%- else -%}
    {{ "<|im_start|>assistant\n" + "<think>\n\n</think>\n"  }}
{%- endif -%}
{%- endif -%}
"""


def corpus(repo, rev):
    """A little of the repository's own prose: README.md and docs/*.md as of commit rev, so the
    fixtures come out the same whatever the docs say today (BPE training is deterministic)."""
    def git(*args):
        return subprocess.run(["git", "-C", repo] + list(args), check=True, stdout=subprocess.PIPE,
                              ).stdout.decode("utf-8")
    names = ["README.md"] + sorted(n for n in git("ls-tree", "--name-only", rev, "docs/").split()
                                   if n.endswith(".md"))
    return [git("show", "%s:%s" % (rev, name)) for name in names]


def train_bpe(texts, regex, nfc, vocab_size):
    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def added(content, special=True):
    return AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False,
                      single_word=False)


def decoder_entry(tok, content):
    """tokenizer_config.json's added_tokens_decoder entry for one added token."""
    token = tok.get_added_tokens_decoder()[tok.token_to_id(content)]
    return str(tok.token_to_id(content)), {
        "content": content, "lstrip": False, "normalized": False, "rstrip": False,
        "single_word": False, "special": token.special}


def save(out, name, tok, config, template_file=None):
    directory = os.path.join(out, name)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    tok.save(os.path.join(directory, "tokenizer.json"))
    config["added_tokens_decoder"] = dict(decoder_entry(tok, t.content)
                                          for t in tok.get_added_tokens_decoder().values())
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    if template_file is not None:
        with open(os.path.join(directory, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(template_file)
    print("make_sft_fixtures: %s: vocabulary %d" % (directory, tok.get_vocab_size(with_added_tokens=True)))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(here, "sft"))
    p.add_argument("--corpus-rev", default=CORPUS_REV, help="the commit whose docs train the BPEs")
    args = p.parse_args()
    texts = corpus(os.path.dirname(os.path.dirname(here)), args.corpus_rev)

    llama = train_bpe(texts, LLAMA3_REGEX, nfc=False, vocab_size=500)
    llama.add_special_tokens([added(t) for t in ["<|begin_of_text|>", "<|end_of_text|>",
                                                 "<|start_header_id|>", "<|end_header_id|>",
                                                 "<|eot_id|>"]])
    bos = llama.token_to_id("<|begin_of_text|>")
    llama.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    save(args.out, "llama3", llama, {
        "bos_token": "<|begin_of_text|>", "clean_up_tokenization_spaces": True,
        "eos_token": "<|eot_id|>", "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 1000000000000000019884624838656,
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": LLAMA3_TEMPLATE})

    qwen = train_bpe(texts, QWEN_REGEX, nfc=True, vocab_size=500)
    qwen.add_special_tokens([added(t) for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    chatml = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None,
              "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
              "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
              "split_special_tokens": False, "unk_token": None}
    save(args.out, "qwen2.5", qwen, dict(chatml, tokenizer_class="Qwen2Tokenizer",
                                         chat_template=QWEN25_TEMPLATE))
    save(args.out, "chatml-generation", qwen,
         dict(chatml, tokenizer_class="PreTrainedTokenizerFast"), template_file=GENERATION_TEMPLATE)
    qwen.add_tokens([added("<think>", special=False), added("</think>", special=False)])
    save(args.out, "smollm3", qwen, dict(chatml, tokenizer_class="PreTrainedTokenizerFast"),
         template_file=SMOLLM3_TEMPLATE)


if __name__ == "__main__":
    main()
