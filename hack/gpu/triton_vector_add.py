# Compiles and runs Triton's vector-add tutorial kernel, filling TRITON_CACHE_DIR.
import os, json, torch, triton, triton.language as tl

@triton.jit
def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(output_ptr + offsets, x + y, mask=mask)

def add(x, y):
    out = torch.empty_like(x)
    n = out.numel()
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)
    add_kernel[grid](x, y, out, n, BLOCK_SIZE=1024)
    return out

torch.manual_seed(0)
x = torch.rand(98432, device="cuda")
y = torch.rand(98432, device="cuda")
out = add(x, y)
torch.cuda.synchronize()
err = (out - (x + y)).abs().max().item()
print(json.dumps({"triton": triton.__version__, "torch": torch.__version__,
                  "device": torch.cuda.get_device_name(0),
                  "capability": torch.cuda.get_device_capability(0),
                  "max_abs_error": err, "cache_dir": os.environ.get("TRITON_CACHE_DIR")}))
assert err == 0.0
