# torch.nn.functional.scaled_dot_product_attention at the shape of sdpa_bench.cpp, 2 threads, median of 30.
import torch, time
torch.set_num_threads(2)
B,H,T,D=16,4,128,32
q=torch.randn(B,H,T,D,requires_grad=True); k=torch.randn(B,H,T,D,requires_grad=True); v=torch.randn(B,H,T,D,requires_grad=True)
g=torch.randn(B,H,T,D)
def f():
    o=torch.nn.functional.scaled_dot_product_attention(q,k,v)
    return o
for r in range(3):
    ts=[];tb=[]
    for i in range(30):
        t0=time.perf_counter(); o=f(); t1=time.perf_counter(); o.backward(g); t2=time.perf_counter()
        ts.append(t1-t0); tb.append(t2-t1)
    ts.sort(); tb.sort()
    print(f"torch sdpa fwd {ts[15]*1e3:.2f} ms bwd {tb[15]*1e3:.2f} ms")
