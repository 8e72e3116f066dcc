#!/usr/bin/env python3
"""Generates llama_packed_golden.json: transformers' own LlamaForCausalLM (float64, eager
attention) on ONE row of packed documents, the way transformers users train on packed data:
`position_ids` restarting at each document, labels -100 outside the loss mask (and at each
document's first token and on the padding), attention kept inside each document by a 4D additive
attention mask (B,1,T,T): block-diagonal causal, 0 allowed, finfo.min blocked. tests/models/
test_llama.cc checks zrt's TokenBatch (positions, doc_start, targets -1, loss_divisor) against
it: the loss and every parameter's gradient.

The script validates its own golden: the packed loss and gradients must equal each document run
alone through transformers (no mask, default positions; the per-document summed cross-entropy
over the total loss-token count, gradients summed) to 1e-12, or it exits with an error.

Same model dims and weights as the llama3-tiny case of make_llama_golden.py (zrt's counter RNG
keyed on the parameter index); tokens are counter_hash(SEED, 1100, i) % vocab. Run with a Python
that has torch and transformers, and commit the output:

    python3 tests/golden/make_llama_packed_golden.py > tests/golden/llama_packed_golden.json

LlamaRMSNorm and the eager attention's softmax run in float64 (the script patches out their
float32 round trips, which alone make packed and separate runs differ by ~5e-7). The loss is computed from the float64 logits with cross_entropy(ignore_index=-100, reduction
"sum") / count after transformers' label shift; transformers' own loss_function (which casts the
logits to float32) is checked against it to 1e-6.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_gpt_golden import b64, counter_hash  # noqa: E402
from make_llama_golden import SEED, llama_dims, weight_values  # noqa: E402

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

DOC_LENGTHS = [7, 1, 9, 5]
PADDING = 2
PAD_TOKEN = 0
TOKEN_STREAM = 1100


def rms_norm_in_input_dtype(self, hidden_states):
    """LlamaRMSNorm.forward without its float32 round trip (the same formula in float64): with
    it, a packed and a separate run differ by float32 roundings (5e-7 relative), too much for
    the 1e-12 self-check. The rotary tables stay transformers' (float32 angles, the same in both
    runs, since the positions are)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def eager_attention_in_input_dtype(module, query, key, value, attention_mask, scaling,
                                   dropout=0.0, **kwargs):
    """modeling_llama.eager_attention_forward with the softmax in the input dtype (transformers
    takes it in float32), for the same reason."""
    key_states = modeling_llama.repeat_kv(key, module.num_key_value_groups)
    value_states = modeling_llama.repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = F.softmax(attn_weights, dim=-1)
    attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
    return attn_output, attn_weights


modeling_llama.LlamaRMSNorm.forward = rms_norm_in_input_dtype
modeling_llama.eager_attention_forward = eager_attention_in_input_dtype


def make_model(dims):
    config = LlamaConfig(**dims, attn_implementation="eager")
    model = LlamaForCausalLM(config).double().eval()
    with torch.no_grad():
        for index, (name, p) in enumerate(model.named_parameters()):
            p.copy_(weight_values(name, tuple(p.shape), index))
    return model, config


def trained(length, t):
    """Is target t of a document of `length` tokens (predicting its token t+1) in the loss: the
    first third of a document's targets (its prompt) is not."""
    return t + 1 < length and t >= length // 3


def shifted_ce_sum(logits, labels):
    """transformers' causal-LM label shift (position i predicts labels[i+1]), summed float64 CE."""
    V = logits.shape[-1]
    shift = F.pad(labels, (0, 1), value=-100)[..., 1:]
    return F.cross_entropy(logits.reshape(-1, V), shift.reshape(-1), ignore_index=-100,
                           reduction="sum")


def main():
    import transformers

    dims = llama_dims()
    model, config = make_model(dims)
    V = config.vocab_size
    T = sum(DOC_LENGTHS) + PADDING

    # The packed row.
    tokens, labels, positions, doc_start, doc_id = [], [], [], [], []
    for d, length in enumerate(DOC_LENGTHS):
        s = len(tokens)
        for t in range(length):
            tokens.append(counter_hash(SEED, TOKEN_STREAM, s + t) % V)
            # labels[i] is the token at i, kept when the target predicting it is trained.
            labels.append(-100 if t == 0 or not trained(length, t - 1) else None)
            positions.append(t)
            doc_start.append(s)
            doc_id.append(d)
    for i, lab in enumerate(labels):
        if lab is None:
            labels[i] = tokens[i]
    pad_start = len(tokens)
    for t in range(PADDING):
        tokens.append(PAD_TOKEN)
        labels.append(-100)
        positions.append(t)
        doc_start.append(pad_start)
        doc_id.append(len(DOC_LENGTHS))
    assert len(tokens) == T
    # zrt's targets: target i = labels[i+1] (-1 when not in the loss).
    targets = [labels[i + 1] if i + 1 < T and labels[i + 1] != -100 else -1 for i in range(T)]
    loss_tokens = sum(1 for x in targets if x >= 0)
    assert loss_tokens == sum(trained(n, t) for n in DOC_LENGTHS for t in range(n))

    ids = torch.tensor([tokens])
    lab = torch.tensor([labels])
    pos = torch.tensor([positions])
    docs = torch.tensor(doc_id)
    allowed = (docs[:, None] == docs[None, :]) & torch.ones(T, T, dtype=torch.bool).tril()
    mask = torch.zeros(1, 1, T, T, dtype=torch.float64)
    mask.masked_fill_(~allowed, torch.finfo(torch.float64).min)

    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos)
    logits = out.logits
    assert logits.dtype == torch.float64, logits.dtype
    packed_sum = shifted_ce_sum(logits, lab)
    loss = packed_sum / loss_tokens
    loss.backward()
    packed_grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}

    # transformers' own loss on the same labels (float32 logits inside): the same to ~1e-6.
    hf_loss = model.loss_function(logits.detach(), lab, vocab_size=V,
                                  num_items_in_batch=torch.tensor(loss_tokens)).item()
    assert abs(hf_loss - loss.item()) <= 1e-6 * abs(loss.item()), (hf_loss, loss.item())

    # Each document alone: no mask, default positions 0.., its own labels.
    model.zero_grad()
    alone_loss = 0.0
    for d, length in enumerate(DOC_LENGTHS):
        s = sum(DOC_LENGTHS[:d])
        out = model(input_ids=ids[:, s:s + length])
        part = shifted_ce_sum(out.logits, lab[:, s:s + length]) / loss_tokens
        part.backward()
        alone_loss += part.item()
    loss_err = abs(alone_loss - loss.item()) / abs(loss.item())
    grad_err = 0.0
    for name, p in model.named_parameters():
        ref = p.grad.norm().item()
        err = (packed_grads[name] - p.grad).norm().item() / max(ref, 1e-300)
        grad_err = max(grad_err, err)
    print(f"packed loss {loss.item():.15g}, documents alone {alone_loss:.15g}: relative "
          f"{loss_err:.3g}; worst gradient relative error {grad_err:.3g}", file=sys.stderr)
    if loss_err > 1e-12 or grad_err > 1e-12:
        sys.exit("the packed run does not equal the documents alone")

    # Without the block mask the documents would see each other: the golden must notice.
    model.zero_grad()
    crossed = shifted_ce_sum(model(input_ids=ids, position_ids=pos).logits, lab) / loss_tokens
    print(f"without the block mask: loss {crossed.item():.15g}", file=sys.stderr)

    doc = {
        "generator": "tests/golden/make_llama_packed_golden.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "label": "llama3-tiny-packed",
        "architecture": config.model_type,
        "dims": dims,
        "B": 1,
        "T": T,
        "seed": SEED,
        "doc_lengths": DOC_LENGTHS,
        "names": list(packed_grads),
        "tokens": tokens,
        "labels_hf": labels,
        "targets": targets,
        "positions": positions,
        "doc_start": doc_start,
        "loss": loss.item(),
        "loss_tokens": loss_tokens,
        "self_check": {"loss_rel_err": loss_err, "grad_rel_err": grad_err,
                       "loss_without_block_mask": crossed.item()},
        "grads": {name: b64(g) for name, g in packed_grads.items()},
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
