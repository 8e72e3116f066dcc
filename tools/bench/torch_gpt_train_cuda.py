#!/usr/bin/env python3
"""GPT-2 124M training-step throughput in PyTorch on one GPU: the reference for zrt-train's
GPU figures in BENCHMARKS.md. Same shapes as zrt's GPT (tied head, no dropout, tanh GELU),
bf16 autocast over fp32 weights, clipping at 1.0, fused AdamW; once with attention written
out as matrix products (as zrt computes it) and once with scaled_dot_product_attention
(flash attention), and with --variants compile also that model under torch.compile (nanoGPT's
`compile=True` path, the strongest plain-PyTorch GPT-2 users run). Prints step time, tokens/s
and peak memory for each; compile's warm-up steps include the compilation.

    python3 tools/bench/torch_gpt_train_cuda.py --batch 8 --seq 1024 --iters 10
    python3 tools/bench/torch_gpt_train_cuda.py --variants sdpa,compile --iters 20
"""
import argparse, math, statistics, time
import torch, torch.nn as nn, torch.nn.functional as F

class Block(nn.Module):
    def __init__(s, C, H, sdpa):
        super().__init__(); s.H=H; s.sdpa=sdpa
        s.ln_1=nn.LayerNorm(C); s.c_attn=nn.Linear(C,3*C); s.c_proj=nn.Linear(C,C)
        s.ln_2=nn.LayerNorm(C); s.c_fc=nn.Linear(C,4*C); s.mlp_proj=nn.Linear(4*C,C)
    def attn(s, x):
        B,T,C=x.shape; hs=C//s.H
        q,k,v=(t.view(B,T,s.H,hs).transpose(1,2) for t in s.c_attn(x).split(C,dim=2))
        if s.sdpa: y=F.scaled_dot_product_attention(q,k,v,is_causal=True)
        else:
            a=(q@k.transpose(-2,-1))/math.sqrt(hs)
            m=torch.ones(T,T,dtype=torch.bool,device=x.device).tril()
            y=F.softmax(a.masked_fill(~m,float('-inf')),dim=-1)@v
        return s.c_proj(y.transpose(1,2).contiguous().view(B,T,C))
    def forward(s,x):
        x=x+s.attn(s.ln_1(x)); return x+s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x)),approximate='tanh'))

class GPT(nn.Module):
    def __init__(s,L,H,C,V,T,sdpa):
        super().__init__(); s.wte=nn.Embedding(V,C); s.wpe=nn.Embedding(T,C)
        s.h=nn.ModuleList(Block(C,H,sdpa) for _ in range(L)); s.ln_f=nn.LayerNorm(C)
    def forward(s,idx,tgt):
        x=s.wte(idx)+s.wpe(torch.arange(idx.shape[1],device=idx.device))
        for b in s.h: x=b(x)
        logits=s.ln_f(x)@s.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1,logits.shape[-1]),tgt.view(-1))

p=argparse.ArgumentParser(); p.add_argument('--batch',type=int,default=8); p.add_argument('--seq',type=int,default=1024)
p.add_argument('--iters',type=int,default=10)
p.add_argument('--variants',default='naive,sdpa',help='comma list of naive, sdpa, compile')
a=p.parse_args()
torch.backends.cuda.matmul.allow_tf32=True
names={'naive':'naive attention','sdpa':'sdpa(flash)','compile':'sdpa(flash)+torch.compile'}
for variant in a.variants.split(','):
    sdpa=variant!='naive'
    torch.manual_seed(0)
    m=GPT(12,12,768,50257,1024,sdpa).cuda()
    step_model=torch.compile(m) if variant=='compile' else m
    opt=torch.optim.AdamW(m.parameters(),lr=6e-4,betas=(0.9,0.95),weight_decay=0.1,fused=True)
    idx=torch.randint(256,(a.batch,a.seq),device='cuda'); tgt=torch.randint(256,(a.batch,a.seq),device='cuda')
    ts=[]
    for i in range(3+a.iters):
        torch.cuda.synchronize(); t=time.perf_counter()
        with torch.autocast('cuda',dtype=torch.bfloat16): loss=step_model(idx,tgt)
        loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(),1.0); opt.step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(); ts.append(time.perf_counter()-t)
    med=statistics.median(ts[3:])
    print(f"torch {torch.__version__} {names[variant]}: step {med*1e3:.1f} ms, {a.batch*a.seq/med:.0f} tok/s, peak mem {torch.cuda.max_memory_allocated()/2**30:.2f} GiB")
    del m,step_model,opt; torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
