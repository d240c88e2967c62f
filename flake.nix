# kernel-builder's entry point: `nix build .#bundle` (or `nix run .#build-and-copy`)
# builds every variant build.toml describes, as kernels-community kernels do.
# Without Nix, `make release` builds the same four CPU variants (README,
# "Publishing to the Hub").
{
  description = "Flake for the spec-verify kernel (speculative-decoding verification, CPU)";

  inputs = {
    kernel-builder.url = "github:huggingface/kernel-builder";
  };

  outputs =
    {
      self,
      kernel-builder,
    }:
    kernel-builder.lib.genFlakeOutputs {
      inherit self;
      path = ./.;
    };
}
