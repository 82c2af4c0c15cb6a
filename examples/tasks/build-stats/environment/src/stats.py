import sys

with open(sys.argv[1]) as f:
    numbers = [float(line) for line in f if line.strip()]
print(f"count={len(numbers)} min={min(numbers):g} max={max(numbers):g} mean={sum(numbers) / len(numbers):g}")
