"""A zoo of training workloads built from torch alone (no downloads, no torchvision).

Ten families, each at several widths, depths and batch sizes, so that the model
can be judged on families it never saw (leave one family out). The families share
operator classes (matmul, convolution, attention, normalisation...) but mix them
in different proportions and sizes, which is what a new architecture looks like
to the predictor.

A :class:`ZooModel` builds a fresh ``nn.Module``, an example batch for a given
batch size and device, and says which loss and optimizer its family trains with.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from throughput_model.errors import UnknownModel


def classification_loss(output: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the last dimension against class 0: the cost of a real classification
    or language-model loss, with targets made on the output's device (works on meta too)."""
    logits = output.reshape(-1, output.shape[-1])
    targets = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits, targets)


# ---------------------------------------------------------------- building blocks


class MLP(nn.Module):
    def __init__(self, inputs: int, width: int, depth: int, classes: int, norm: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        size = inputs
        for _ in range(depth):
            layers += [nn.Linear(size, width)]
            layers += [nn.LayerNorm(width), nn.GELU()] if norm else [nn.ReLU()]
            size = width
        layers.append(nn.Linear(size, classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False, groups=1)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False, groups=groups)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.short(x))


class Bottleneck(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        mid = cout // 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, mid, 3, stride, 1, bias=False, groups=groups), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout),
        )
        self.short = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.short(x))


class ResNet(nn.Module):
    """ResNet/ResNeXt-style: a stem, stages of residual blocks doubling width, pooling, a head."""

    def __init__(self, width: int, blocks: tuple[int, ...], bottleneck: bool, groups: int, classes: int,
                 imagenet_stem: bool) -> None:
        super().__init__()
        block = Bottleneck if bottleneck else BasicBlock
        expansion = 4 if bottleneck else 1
        if imagenet_stem:
            self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                      nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        else:
            self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                      nn.ReLU(inplace=True))
        layers: list[nn.Module] = []
        cin = width
        for stage, count in enumerate(blocks):
            cout = width * (2 ** stage) * expansion
            for index in range(count):
                layers.append(block(cin, cout, 2 if (index == 0 and stage > 0) else 1, groups))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand, depthwise 3x3, optional squeeze-excite, 1x1 project."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int, squeeze: bool) -> None:
        super().__init__()
        mid = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(inplace=True))
        self.depthwise = nn.Sequential(nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False),
                                       nn.BatchNorm2d(mid), nn.Hardswish())
        self.se = nn.Sequential(nn.Linear(mid, max(8, mid // 4)), nn.ReLU(), nn.Linear(max(8, mid // 4), mid),
                                nn.Sigmoid()) if squeeze else None
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.depthwise(self.expand(x))
        if self.se is not None:
            y = y * self.se(y.mean((2, 3)))[:, :, None, None]
        y = self.project(y)
        return x + y if self.use_res else y


class MobileNet(nn.Module):
    def __init__(self, width: int, stages: int, expand: int, squeeze: bool, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU6(inplace=True))
        blocks: list[nn.Module] = []
        cin = width
        for stage in range(stages):
            cout = width * (stage + 1)
            blocks.append(InvertedResidual(cin, cout, 2 if stage > 0 else 1, expand, squeeze))
            blocks.append(InvertedResidual(cout, cout, 1, expand, squeeze))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Encoder(nn.Module):
    """BERT-style: token + position embeddings, post-norm encoder layers (nn.MultiheadAttention)."""

    def __init__(self, vocab: int, dim: int, depth: int, heads: int, seq: int, classes: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(seq, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.1, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.encoder(self.tokens(ids) + self.positions(positions))
        return self.head(x[:, 0])


class SelfAttention(nn.Module):
    """Multi-head self-attention through ``F.scaled_dot_product_attention`` (fused where available)."""

    def __init__(self, dim: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


class PreNormBlock(nn.Module):
    """Pre-norm transformer block; ``dropout`` on the residual branches (GPT-2 style)."""

    def __init__(self, dim: int, heads: int, causal: bool, mlp_ratio: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads, causal)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.drop(self.mlp(self.norm2(x)))


class Decoder(nn.Module):
    """GPT-style decoder-only LM: causal pre-norm blocks, tied-size LM head over the vocabulary."""

    def __init__(self, vocab: int, dim: int, depth: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Parameter(torch.zeros(1, seq, dim))
        self.blocks = nn.Sequential(*[PreNormBlock(dim, heads, True, 4, dropout=0.1) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions[:, : ids.shape[1]]
        return self.head(self.norm(self.blocks(x)))


class RNNClassifier(nn.Module):
    def __init__(self, cell: str, inputs: int, hidden: int, layers: int, bidirectional: bool, classes: int) -> None:
        super().__init__()
        kind = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[cell]
        self.rnn = kind(inputs, hidden, layers, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class AudioConv(nn.Module):
    """1-D convolutional audio classifier on raw waveforms: plain convolutions (M5 / wav2letter),
    depthwise-separable ones (QuartzNet) or a convolutional front end feeding a recurrent layer
    (DeepSpeech)."""

    def __init__(self, width: int, depth: int, kernel: int, classes: int, block: str = "plain") -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv1d(1, width, 80, 4), nn.BatchNorm1d(width), nn.ReLU(), nn.MaxPool1d(4)]
        cin = width
        for index in range(depth):
            cout = width * (2 if index >= depth // 2 else 1)
            if block == "separable":
                layers += [nn.Conv1d(cin, cin, kernel, padding=kernel // 2, groups=cin), nn.Conv1d(cin, cout, 1)]
            else:
                layers += [nn.Conv1d(cin, cout, kernel, padding=kernel // 2)]
            layers += [nn.BatchNorm1d(cout), nn.ReLU()]
            if index % 2 == 1:
                layers.append(nn.MaxPool1d(2))
            cin = cout
        self.body = nn.Sequential(*layers)
        self.rnn = nn.GRU(cin, 2 * width, batch_first=True) if block == "recurrent" else None
        self.head = nn.Linear(2 * width if self.rnn is not None else cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.body(x)
        if self.rnn is None:
            return self.head(features.mean(-1))
        out, _ = self.rnn(features.transpose(1, 2))
        return self.head(out[:, -1])


class ViT(nn.Module):
    def __init__(self, image: int, patch: int, dim: int, depth: int, heads: int, classes: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        count = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.positions = nn.Parameter(torch.zeros(1, count + 1, dim))
        self.blocks = nn.Sequential(*[PreNormBlock(dim, heads, False, 4) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.positions
        return self.head(self.norm(self.blocks(x))[:, 0])


class Recommender(nn.Module):
    """DLRM-style click model: one ``nn.EmbeddingBag`` per sparse feature (sum of the bag's rows),
    the pooled vectors concatenated into an MLP. With ``sparse`` the tables get sparse gradients
    (one row per looked-up index) instead of dense table-sized ones."""

    def __init__(self, rows: int, dim: int, tables: int, width: int, depth: int, sparse: bool) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum", sparse=sparse) for _ in range(tables))
        self.mlp = MLP(dim * tables, width, depth, 2, norm=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids: (batch, tables, bag)
        pooled = [table(ids[:, index]) for index, table in enumerate(self.tables)]
        return self.mlp(torch.cat(pooled, dim=1))


class SequenceRecommender(nn.Module):
    """GRU4Rec-style session model: the item embeddings of a session run through a recurrent
    cell; the last state, joined with the candidate item's embedding, scores the click."""

    def __init__(self, items: int, dim: int, cell: str, hidden: int, sparse: bool) -> None:
        super().__init__()
        self.items = nn.Embedding(items, dim, sparse=sparse)
        self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell](dim, hidden, batch_first=True)
        self.head = nn.Sequential(nn.Linear(hidden + dim, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids: (batch, session + 1), the last is the candidate
        embedded = self.items(ids)
        states, _ = self.rnn(embedded[:, :-1])
        return self.head(torch.cat([states[:, -1], embedded[:, -1]], dim=1))


class UNet(nn.Module):
    """U-Net encoder-decoder for per-pixel classification: two 3x3 convolutions per level (plain or
    depthwise-separable), max-pool down, transposed convolution up, the encoder's features
    joined back through skip connections. Returns (batch, height, width, classes)."""

    def __init__(self, width: int, levels: int, separable: bool, classes: int) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Module:
            def conv(a: int, b: int) -> list[nn.Module]:
                if separable:
                    return [nn.Conv2d(a, a, 3, padding=1, groups=a, bias=False), nn.Conv2d(a, b, 1, bias=False)]
                return [nn.Conv2d(a, b, 3, padding=1, bias=False)]
            return nn.Sequential(*conv(cin, cout), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                                 *conv(cout, cout), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True))
        self.down = nn.ModuleList(block(width * 2 ** i, width * 2 ** (i + 1)) for i in range(levels))
        self.up = nn.ModuleList(nn.ConvTranspose2d(width * 2 ** (i + 1), width * 2 ** i, 2, stride=2)
                                for i in reversed(range(levels)))
        self.merge = nn.ModuleList(block(width * 2 ** (i + 1), width * 2 ** i) for i in reversed(range(levels)))
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.stem(x)]
        for down in self.down:
            skips.append(down(F.max_pool2d(skips[-1], 2)))
        y = skips.pop()
        for up, merge in zip(self.up, self.merge):
            y = merge(torch.cat([up(y), skips.pop()], dim=1))
        return self.head(y).permute(0, 2, 3, 1)


# ---------------------------------------------------------------- the zoo


@dataclass(frozen=True)
class ZooModel:
    """One architecture of the zoo; :meth:`batch` makes its input for a batch size."""

    name: str
    family: str
    make: Callable[[], nn.Module]
    example: Callable[[int, torch.device], torch.Tensor]
    batches: tuple[int, ...]
    optimizer: str
    quick: bool = False
    """Part of ``adloader model profile --quick``."""

    def batch(self, size: int, device: str | torch.device = "cpu") -> torch.Tensor:
        return self.example(size, torch.device(device))


def _images(size: int, channels: int = 3) -> Callable[[int, torch.device], torch.Tensor]:
    return lambda batch, device: torch.randn(batch, channels, size, size, device=device)


def _tokens(vocab: int, seq: int) -> Callable[[int, torch.device], torch.Tensor]:
    return lambda batch, device: torch.randint(0, vocab, (batch, seq), device=device)


def _sequence(steps: int, features: int) -> Callable[[int, torch.device], torch.Tensor]:
    return lambda batch, device: torch.randn(batch, steps, features, device=device)


def _wave(samples: int) -> Callable[[int, torch.device], torch.Tensor]:
    return lambda batch, device: torch.randn(batch, 1, samples, device=device)


def _bags(rows: int, tables: int, bag: int) -> Callable[[int, torch.device], torch.Tensor]:
    return lambda batch, device: torch.randint(0, rows, (batch, tables, bag), device=device)


def _vectors(size: int) -> Callable[[int, torch.device], torch.Tensor]:
    return lambda batch, device: torch.randn(batch, size, device=device)


def _zoo() -> list[ZooModel]:
    models: list[ZooModel] = []

    def add(name: str, family: str, make: Callable[[], nn.Module], example, batches, optimizer, quick=False):
        models.append(ZooModel(name, family, make, example, tuple(batches), optimizer, quick))

    for width, depth, norm, quick in [(256, 2, False, True), (512, 3, False, False), (1024, 2, True, False),
                                      (1024, 4, False, False), (2048, 2, False, True), (512, 6, True, False),
                                      (128, 3, True, False), (2048, 3, True, False)]:
        add(f"mlp-w{width}-d{depth}{'-ln' if norm else ''}", "mlp",
            lambda w=width, d=depth, n=norm: MLP(784, w, d, 10, n), _vectors(784),
            (16, 64, 256) if width <= 1024 else (8, 32, 128), "adamw", quick)

    for width, blocks, bottleneck, groups, image, batches, quick in [
        (16, (1, 1, 1), False, 1, 32, (4, 16, 32), True), (16, (2, 2, 2), False, 1, 32, (4, 12, 24), False),
        (32, (1, 1, 1), False, 1, 32, (2, 8, 16), False), (32, (2, 2), False, 4, 32, (2, 8, 16), False),
        (16, (1, 1, 1), True, 1, 32, (4, 16, 32), False), (24, (2, 2, 2), True, 4, 32, (2, 6, 12), True),
        (16, (2, 2, 2, 2), False, 1, 64, (2, 8, 16), False), (32, (1, 1, 1, 1), True, 8, 32, (2, 6, 12), False),
    ]:
        kind = "bneck" if bottleneck else "basic"
        stem = image >= 64  # ImageNet-style stem (7x7/2 conv, 3x3/2 max pool) on the larger images
        add(f"resnet-{kind}-w{width}-{'x'.join(map(str, blocks))}-g{groups}-i{image}", "resnet",
            lambda w=width, b=blocks, bn=bottleneck, g=groups, s=stem: ResNet(w, b, bn, g, 10, s),
            _images(image), batches, "sgd", quick)

    for width, stages, expand, squeeze, image, batches, quick in [
        (16, 3, 4, False, 32, (4, 16, 32), True), (16, 4, 6, True, 32, (2, 8, 16), False),
        (24, 3, 6, False, 32, (2, 8, 16), False), (32, 3, 4, True, 32, (2, 8, 16), True),
        (16, 2, 6, False, 48, (2, 6, 12), False), (24, 4, 4, True, 48, (1, 4, 8), False),
        (32, 4, 6, False, 32, (1, 4, 8), False), (48, 2, 4, False, 32, (1, 4, 8), False),
    ]:
        add(f"mobile-w{width}-s{stages}-e{expand}{'-se' if squeeze else ''}-i{image}", "mobile",
            lambda w=width, s=stages, e=expand, q=squeeze: MobileNet(w, s, e, q, 10),
            _images(image), batches, "sgd", quick)

    for dim, depth, heads, seq, batches, quick in [
        (128, 2, 4, 64, (4, 16, 32), True), (256, 2, 4, 64, (2, 8, 16), False), (128, 4, 4, 128, (2, 6, 12), False),
        (256, 4, 8, 64, (1, 4, 8), True), (384, 2, 6, 64, (2, 6, 12), False), (192, 3, 4, 128, (1, 4, 8), False),
        (64, 6, 2, 128, (4, 12, 24), False), (512, 1, 8, 64, (2, 6, 12), False),
    ]:
        add(f"encoder-d{dim}-l{depth}-h{heads}-s{seq}", "encoder",
            lambda d=dim, l=depth, h=heads, s=seq: Encoder(8000, d, l, h, s, 2), _tokens(8000, seq),
            batches, "adamw", quick)

    for dim, depth, heads, seq, vocab, batches, quick in [
        (128, 2, 4, 64, 4000, (2, 8, 16), True), (256, 2, 4, 128, 4000, (1, 3, 6), False),
        (128, 4, 4, 128, 8000, (1, 4, 8), False), (256, 4, 8, 64, 8000, (1, 4, 8), True),
        (384, 2, 6, 64, 2000, (1, 4, 8), False), (192, 3, 6, 128, 4000, (1, 3, 6), False),
        (64, 6, 2, 128, 2000, (2, 8, 16), False), (512, 1, 8, 64, 8000, (1, 2, 4), False),
    ]:
        add(f"decoder-d{dim}-l{depth}-h{heads}-s{seq}-v{vocab}", "decoder",
            lambda d=dim, l=depth, h=heads, s=seq, v=vocab: Decoder(v, d, l, h, s), _tokens(vocab, seq),
            batches, "adamw", quick)

    for cell, hidden, layers, steps, bidirectional, quick in [
        ("lstm", 128, 1, 32, False, True), ("lstm", 256, 2, 32, False, False), ("gru", 256, 1, 64, False, True),
        ("gru", 128, 2, 64, True, False), ("rnn", 256, 2, 64, False, False), ("lstm", 512, 1, 16, False, False),
        ("gru", 512, 1, 32, False, False), ("lstm", 64, 3, 128, True, False),
    ]:
        add(f"rnn-{cell}-h{hidden}-l{layers}-t{steps}{'-bi' if bidirectional else ''}", "rnn",
            lambda c=cell, h=hidden, l=layers, b=bidirectional: RNNClassifier(c, 64, h, l, b, 10),
            _sequence(steps, 64), (8, 24, 64), "adam", quick)

    for block, width, depth, kernel, samples, batches, quick in [
        ("plain", 32, 4, 3, 8000, (4, 16, 32), True), ("plain", 64, 4, 3, 8000, (2, 8, 16), False),
        ("plain", 128, 4, 3, 8000, (1, 4, 8), False), ("plain", 96, 6, 3, 4000, (4, 12, 24), False),
        ("separable", 64, 6, 15, 8000, (4, 16, 32), False), ("separable", 96, 4, 33, 8000, (1, 4, 8), True),
        ("recurrent", 32, 2, 5, 8000, (2, 8, 16), False), ("recurrent", 64, 2, 3, 8000, (1, 4, 8), False),
    ]:
        add(f"audio-{block}-w{width}-d{depth}-k{kernel}-n{samples}", "audio",
            lambda w=width, d=depth, k=kernel, b=block: AudioConv(w, d, k, 35, b), _wave(samples), batches, "adam",
            quick)

    for image, patch, dim, depth, heads, batches, quick in [
        (32, 4, 128, 2, 4, (4, 16, 32), True), (32, 4, 192, 4, 6, (2, 6, 12), False), (64, 8, 256, 4, 8, (1, 4, 8), True),
        (32, 8, 384, 2, 6, (4, 12, 24), False), (64, 16, 512, 2, 8, (4, 12, 24), False), (32, 2, 96, 2, 4, (1, 4, 8), False),
        (64, 8, 128, 6, 4, (2, 8, 16), False), (48, 6, 256, 3, 4, (2, 6, 12), False),
    ]:
        add(f"vit-i{image}-p{patch}-d{dim}-l{depth}-h{heads}", "vit",
            lambda i=image, p=patch, d=dim, l=depth, h=heads: ViT(i, p, d, l, h, 10), _images(image),
            batches, "adamw", quick)
    for rows, dim, tables, bag, width, depth, sparse, optimizer, batches, quick in [
        (50_000, 32, 1, 16, 256, 2, False, "adam", (32, 128, 512), True),
        (50_000, 64, 2, 8, 512, 3, True, "sgd-plain", (32, 128, 512), True),
        (50_000, 16, 4, 4, 128, 2, False, "adamw", (64, 256, 1024), False),
        (20_000, 32, 4, 32, 256, 3, True, "sgd-plain", (16, 64, 256), False),
        (100_000, 16, 1, 64, 512, 2, False, "sgd", (16, 64, 256), False),
        (50_000, 64, 1, 8, 1024, 2, False, "adam", (16, 64, 256), False),
    ]:
        add(f"recsys-bag-r{rows}-d{dim}-t{tables}-b{bag}-w{width}-l{depth}{'-sparse' if sparse else ''}", "recsys",
            lambda r=rows, d=dim, t=tables, w=width, l=depth, s=sparse: Recommender(r, d, t, w, l, s),
            _bags(rows, tables, bag), batches, optimizer, quick)
    for cell, items, dim, hidden, session, sparse, optimizer, quick in [
        ("gru", 50_000, 64, 128, 20, False, "adam", False), ("lstm", 50_000, 32, 128, 30, True, "sgd-plain", False),
    ]:
        add(f"recsys-{cell}-i{items}-d{dim}-h{hidden}-t{session}{'-sparse' if sparse else ''}", "recsys",
            lambda c=cell, i=items, d=dim, h=hidden, s=sparse: SequenceRecommender(i, d, c, h, s),
            _tokens(items, session + 1), (8, 32, 128), optimizer, quick)

    for width, levels, separable, image, batches, quick in [
        (8, 2, False, 32, (2, 8, 16), True), (16, 3, False, 32, (1, 4, 8), False), (8, 3, True, 64, (1, 4, 8), True),
        (16, 2, True, 32, (2, 8, 16), False), (12, 3, False, 48, (1, 3, 6), False), (24, 2, True, 48, (1, 3, 6), False),
        (8, 4, False, 64, (1, 2, 4), False), (16, 3, True, 64, (1, 2, 4), False),
    ]:
        add(f"unet-w{width}-l{levels}{'-sep' if separable else ''}-i{image}", "unet",
            lambda w=width, l=levels, s=separable: UNet(w, l, s, 4), _images(image), batches, "adam", quick)
    return models


ZOO: tuple[ZooModel, ...] = tuple(_zoo())
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(m.family for m in ZOO))


def resnet50(classes: int = 1000) -> nn.Module:
    """A ResNet-50-sized network (bottleneck blocks 3-4-6-3, width 64, 25.6 M parameters, 224x224 input);
    used to check that describing a realistic model stays fast. Not profiled on this CPU (too slow)."""
    return ResNet(64, (3, 4, 6, 3), True, 1, classes, imagenet_stem=True)


def zoo_model(name: str) -> ZooModel:
    """Look a zoo architecture up by name (``adloader model predict --zoo NAME``)."""
    for model in ZOO:
        if model.name == name:
            return model
    close = [m.name for m in ZOO if name.split("-")[0] in m.name][:8]
    raise UnknownModel(f"no zoo model named {name!r}; e.g. {close or [m.name for m in ZOO[:8]]} "
                       f"(list them all with 'adloader model predict --list')")


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

