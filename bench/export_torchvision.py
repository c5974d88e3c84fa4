#!/usr/bin/python3
"""Exports torchvision architectures to ONNX for runtime and quantization checks beyond the fixtures.

Random weights (nothing is downloaded), BatchNorm running statistics randomized so that folding is
exercised, dynamic batch. Next to each MODEL.onnx it writes MODEL.input.npy (2 random samples) and
MODEL.output.npy (PyTorch's output for them), and a calibration set calibRES/x.npy per resolution.
The detectors (ssdlite, retinanet, fasterrcnn_mbv3) take one image per run (a fixed batch of 1)
and output boxes, scores and labels after their NMS; their .output.npy holds the scores.
Needs Debian's python3-torchvision (scripts/install-deps.sh --bench installs it).

  /usr/bin/python3 bench/export_torchvision.py OUT_DIR [--resolution N] [name ...]

--resolution N exports at NxN instead of each model's usual resolution (e.g. 1024 for the
segmentation networks: precision recovery and memory at high resolution).

Then, e.g.:
  build/slimquant run OUT_DIR/resnet18.onnx --input input=OUT_DIR/resnet18.input.npy --output-dir o
  node bench/compare_runtimes.js --models OUT_DIR/resnet18.onnx --calib npy:OUT_DIR/calib224 --batches 1
"""
import os
import sys

import numpy as np
import torch
import torchvision.models as M
import torchvision.models.detection as D
import torchvision.models.segmentation as S


class ConvBnRelu(torch.nn.Sequential):
    def __init__(self, cin, cout, dilation=1):
        super().__init__(torch.nn.Conv2d(cin, cout, 3, padding=dilation, dilation=dilation),
                         torch.nn.BatchNorm2d(cout), torch.nn.ReLU(inplace=True))


def down_path(stages, x):
    """Each stage's output, the stages applied in turn with a 2x2 max pool (ceil) between them."""
    outputs = []
    for i, stage in enumerate(stages):
        x = stage(x if i == 0 else torch.nn.functional.max_pool2d(x, 2, 2, ceil_mode=True))
        outputs.append(x)
    return outputs


class ResidualUBlock(torch.nn.Module):
    """A U-Net inside one block (the residual U-block of U^2-Net, Qin et al. 2020): `depth` levels of
    3x3 convolutions, max-pooled on the way down, bilinearly upsampled to the skip's size and
    concatenated on the way up, plus the block's input convolution as a residual: 2 * depth convs."""

    def __init__(self, depth, cin, mid, cout):
        super().__init__()
        self.entry = ConvBnRelu(cin, cout)
        self.down = torch.nn.ModuleList([ConvBnRelu(cout, mid)] + [ConvBnRelu(mid, mid) for _ in range(depth - 2)])
        self.bottom = ConvBnRelu(mid, mid, dilation=2)
        self.up = torch.nn.ModuleList([ConvBnRelu(2 * mid, mid) for _ in range(depth - 2)] + [ConvBnRelu(2 * mid, cout)])

    def forward(self, x):
        entry = self.entry(x)
        skips = down_path(self.down, entry)
        h = self.bottom(skips[-1])
        for conv, skip in zip(self.up, reversed(skips)):
            if h.shape[-2:] != skip.shape[-2:]:
                h = torch.nn.functional.interpolate(h, size=skip.shape[-2:], mode="bilinear", align_corners=False)
            h = conv(torch.cat([h, skip], 1))
        return h + entry


class ResidualUNet(torch.nn.Module):
    """Not a torchvision model: a U-Net of residual U-blocks as high-resolution salient-object and
    matting networks are built (U^2-Net's small configuration: 119 convolutions, 16-channel inner
    levels, 64-channel stages, six side outputs fused), for FP32 and INT8 speed at 1024x1024."""

    def __init__(self):
        super().__init__()
        depths = [7, 6, 5, 4, 4, 4]
        self.encoders = torch.nn.ModuleList(
            [ResidualUBlock(d, 3 if i == 0 else 64, 16, 64) for i, d in enumerate(depths)])
        self.decoders = torch.nn.ModuleList([ResidualUBlock(d, 128, 16, 64) for d in reversed(depths[:-1])])
        self.sides = torch.nn.ModuleList([torch.nn.Conv2d(64, 1, 3, padding=1) for _ in depths])
        self.fuse = torch.nn.Conv2d(len(depths), 1, 1)

    def forward(self, x):
        size = x.shape[-2:]
        features = down_path(self.encoders, x)
        h = features[-1]
        decoded = [h]
        for block, skip in zip(self.decoders, reversed(features[:-1])):
            h = torch.nn.functional.interpolate(h, size=skip.shape[-2:], mode="bilinear", align_corners=False)
            h = block(torch.cat([h, skip], 1))
            decoded.append(h)
        sides = [torch.nn.functional.interpolate(side(d), size=size, mode="bilinear", align_corners=False)
                 for side, d in zip(self.sides, reversed(decoded))]
        return torch.sigmoid(self.fuse(torch.cat(sides, 1)))


SPECS = [  # name, constructor, input resolution, opset
    ("resnet18", lambda: M.resnet18(), 224, 13),
    ("resnet50", lambda: M.resnet50(), 224, 11),
    ("mobilenet_v2", lambda: M.mobilenet_v2(), 224, 13),
    ("mobilenet_v3_small", lambda: M.mobilenet_v3_small(), 224, 17),
    ("mobilenet_v3_large", lambda: M.mobilenet_v3_large(), 224, 14),
    ("efficientnet_b0", lambda: M.efficientnet_b0(), 224, 13),
    ("shufflenet_v2", lambda: M.shufflenet_v2_x1_0(), 224, 11),
    ("squeezenet1_1", lambda: M.squeezenet1_1(), 224, 12),
    ("densenet121", lambda: M.densenet121(), 224, 13),
    ("googlenet", lambda: M.googlenet(aux_logits=False, init_weights=True), 224, 13),
    ("inception_v3", lambda: M.inception_v3(aux_logits=False, init_weights=True), 299, 13),
    ("regnet_y_400mf", lambda: M.regnet_y_400mf(), 224, 13),
    ("mnasnet1_0", lambda: M.mnasnet1_0(), 224, 13),
    ("convnext_tiny", lambda: M.convnext_tiny(), 224, 17),
    ("vit_b_16", lambda: M.vit_b_16(), 224, 14),
    ("swin_t", lambda: M.swin_t(), 224, 17),
    ("vgg11_bn", lambda: M.vgg11_bn(), 224, 11),
    ("alexnet", lambda: M.alexnet(), 224, 11),
    ("lraspp", lambda: S.lraspp_mobilenet_v3_large(weights_backbone=None), 256, 13),
    ("deeplabv3_mbv3", lambda: S.deeplabv3_mobilenet_v3_large(weights_backbone=None), 256, 13),
    ("fcn_resnet50", lambda: S.fcn_resnet50(weights_backbone=None), 256, 11),
    ("rsu_unet", lambda: ResidualUNet(), 1024, 13),
    # Detectors with their post-processing in the graph (score threshold, top-k, NMS: outputs whose
    # size depends on the data), one image per run: exported with a fixed batch of 1.
    ("ssdlite", lambda: D.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None), 320, 13),
    ("retinanet", lambda: D.retinanet_resnet50_fpn(weights=None, weights_backbone=None), 320, 13),
    ("fasterrcnn_mbv3", lambda: D.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None), 320, 13),
]
DETECTORS = {"ssdlite", "retinanet", "fasterrcnn_mbv3"}


class OutputTensor(torch.nn.Module):
    """Segmentation models return {"out": ...}: export the tensor."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        y = self.model(x)
        return y["out"] if isinstance(y, dict) else y


class Detections(torch.nn.Module):
    """Detectors take a list of images and return a list of {boxes, scores, labels}: one image in,
    its three tensors out."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        y = self.model(list(x))[0]
        return y["boxes"], y["scores"], y["labels"]


def main():
    out = sys.argv[1]
    args = sys.argv[2:]
    resolution = None
    if "--resolution" in args:
        i = args.index("--resolution")
        resolution = int(args[i + 1])
        del args[i:i + 2]
    only = set(args)
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    for name, make, res, opset in SPECS:
        if only and name not in only:
            continue
        res = resolution or res
        detector = name in DETECTORS
        model = (Detections if detector else OutputTensor)(make().eval())
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for mod in model.modules():
                if isinstance(mod, torch.nn.BatchNorm2d):
                    mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
                    mod.running_var.copy_(torch.rand(mod.num_features, generator=g) * 0.5 + 0.75)
                if detector and isinstance(mod, torch.nn.Conv2d):
                    # torchvision's detection heads start near zero (std 0.01-0.03, and SSDlite's
                    # BatchNorm-free extra blocks shrink the maps to 1e-13): scale each convolution
                    # to unit gain so that the random network's scores and boxes move with its input.
                    fan_in = mod.weight[0].numel()
                    mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) * (2.0 / fan_in) ** 0.5)
            x = torch.randn(1 if detector else 2, 3, res, res, generator=g)
            y = model(x)
        if detector:
            torch.onnx.export(model, x, f"{out}/{name}.onnx", opset_version=opset, input_names=["input"],
                              output_names=["boxes", "scores", "labels"])
            y = y[1]  # the scores
        else:
            torch.onnx.export(model, x, f"{out}/{name}.onnx", opset_version=opset, input_names=["input"],
                              output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
        np.save(f"{out}/{name}.input.npy", x.numpy())
        np.save(f"{out}/{name}.output.npy", y.numpy())
        calib = f"{out}/calib{res}"
        if not os.path.exists(f"{calib}/x.npy"):
            os.makedirs(calib, exist_ok=True)
            np.save(f"{calib}/x.npy", rng.standard_normal((16, 3, res, res)).astype(np.float32))
        print("exported", name, flush=True)


if __name__ == "__main__":
    main()
