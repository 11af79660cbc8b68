"""Writes train.bin and val.bin of uniformly random tokens in cleave's token shard format (see
src/cleave/data/tokens.h), for throughput benchmarks where the text does not matter. With
DOC_LEN, documents of DOC_LEN tokens: every DOC_LEN-th token is the end-of-text id 2 (what
`cleave tokenize` writes after each document, data.document_separator's default) and no other is.

    random_tokens.py OUT_DIR VOCAB COUNT [DOC_LEN]"""
import struct
import sys

import numpy as np

out_dir, vocab, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
doc_len = int(sys.argv[4]) if len(sys.argv) > 4 else 0
rng = np.random.default_rng(0)
width = 2 if vocab <= 65536 else 4
for name, n in (("train.bin", count), ("val.bin", count // 10)):
    tokens = rng.integers(0, vocab, size=n, dtype=np.uint32)
    if doc_len:
        tokens[tokens == 2] = 3
        tokens[doc_len - 1::doc_len] = 2
    tokens = tokens.astype(np.uint16 if width == 2 else np.uint32)
    with open(f"{out_dir}/{name}", "wb") as f:
        f.write(struct.pack("<8sIIQII", b"CLVTOKS\0", 1, width, n, vocab, 0))
        f.write(tokens.tobytes())
