"""The speed of the PyTorch baseline's model shape on this machine, for the comparison in README.md.

Times a PyTorch train step of the multi30k_ende model shape (3+3 layers, d_model 256, d_ff 1024,
4 heads, vocab 8000, post-LN, shared embeddings) on random tokens, batch x length per side:
`python torch_step.py 128 24` in a venv with `pip install torch==2.13.0` (not a t2t_jax
dependency). Compare `python -m t2t_jax.tools.bench --what=train --experiment=multi30k_ende
--batch=128 --length=24 --devices=1
--set model.d_model=256 --set model.d_ff=1024 --set model.d_k=64 --set model.d_v=64` (the recipe is width 128 since 2026-11-24)."""
import math, sys, time
import torch, torch.nn as nn

batch, length = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(2)
torch.manual_seed(0)
V, D = 8000, 256

class M(nn.Module):
  def __init__(self):
    super().__init__()
    self.emb = nn.Embedding(V, D)
    self.t = nn.Transformer(D, 4, 3, 3, 1024, 0.1, batch_first=True)
    pe = torch.zeros(512, D); pos = torch.arange(512).unsqueeze(1)
    div = torch.exp(torch.arange(0, D, 2) * (-math.log(10000.0) / D))
    pe[:, 0::2] = torch.sin(pos * div); pe[:, 1::2] = torch.cos(pos * div)
    self.register_buffer("pe", pe)
  def forward(self, src, tgt):
    e = lambda x: self.emb(x) * math.sqrt(D) + self.pe[: x.shape[1]]
    mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
    y = self.t(e(src), e(tgt), tgt_mask=mask, tgt_is_causal=True)
    return y @ self.emb.weight.T

m = M(); opt = torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
lossf = nn.CrossEntropyLoss(label_smoothing=0.1)
src = torch.randint(4, V, (batch, length)); tgt = torch.randint(4, V, (batch, length + 1))
def step():
  opt.zero_grad(); out = m(src, tgt[:, :-1]); l = lossf(out.reshape(-1, V), tgt[:, 1:].reshape(-1))
  l.backward(); opt.step()
for _ in range(3): step()
times = []
for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 10):
  t0 = time.perf_counter(); step(); times.append(time.perf_counter() - t0)
times.sort(); med = times[len(times) // 2]
print(f"torch {torch.__version__}: batch {batch} x {length}: {med*1000:.0f} ms/step, "
      f"{batch*length/med:,.0f} target tok/s (median of {len(times)})")
