import csv, sys, collections, re
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ki = hdr.index("Kernel Name"); mi = hdr.index("Metric Name"); vi = hdr.index("Metric Value"); ii = hdr.index("ID")
kern = collections.OrderedDict()
for r in rows:
    if not r[ii].isdigit(): continue
    k = kern.setdefault(int(r[ii]), {"name": r[ki]})
    k[r[mi]] = float(r[vi].replace(",", ""))
steps, cur = [], None
for i, k in kern.items():
    if "EmbeddingKernel" in k["name"]:
        cur = []; steps.append(cur)
    if cur is not None: cur.append(k)
for label, st in zip(["b64 ctx1024", "b1 ctx1024"], steps):
    tot = sum(k["gpu__time_duration.sum"] for k in st) / 1e3
    rd = sum(k["dram__bytes_read.sum"] for k in st) / 1e6
    print(f"{label} step: {len(st)} kernels, sum of durations {tot:.1f} us, DRAM read {rd:.0f} MB")
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for k in st:
        n = re.sub(r"<.*", "", k["name"].split("(")[0].replace("void ", "").replace("<unnamed>", "anon").split("::")[-1])
        a = agg[n]; a[0] += 1; a[1] += k["gpu__time_duration.sum"] / 1e3; a[2] += k["dram__bytes_read.sum"] / 1e6
    for n, (c, t, b) in sorted(agg.items(), key=lambda x: -x[1][1]):
        print(f"   {n[:50]:50s} n={c:3d} {t:8.1f} us {b:8.1f} MB {b/1e6/(t/1e6) if t else 0:6.2f} TB/s")
