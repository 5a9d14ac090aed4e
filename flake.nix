{
  description = "llmgw-store: a Nix-style content-addressed store for uv-built LLM inference environments";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAll = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in {
      packages = forAll (pkgs: {
        default = pkgs.python3Packages.buildPythonApplication {
          pname = "llmgw-store";
          version = "0.1.0";
          pyproject = true;
          src = ./.;
          build-system = [ pkgs.python3Packages.setuptools ];
          dependencies = with pkgs.python3Packages; [ httpx blake3 sqlite-utils click filelock packaging ];
          # pyproject pins uv==0.13.9 from PyPI; under Nix the store's own pinned uv is installed at
          # first use (or pass --uv), so nixpkgs' uv is only put on PATH, not checked against the pin.
          pythonRemoveDeps = [ "uv" ];
          makeWrapperArgs = [ "--prefix" "PATH" ":" "${pkgs.uv}/bin" ];
          nativeCheckInputs = [ pkgs.python3Packages.pytest pkgs.uv ];
          doCheck = false; # the suite starts servers and processes; run it with `nix develop -c pytest`
        };
      });

      devShells = forAll (pkgs: {
        default = pkgs.mkShell {
          packages = [
            (pkgs.python3.withPackages (ps: with ps; [ httpx blake3 sqlite-utils click filelock packaging pytest ]))
            pkgs.uv
          ];
          shellHook = ''
            export LLMGW_STORE_UV=${pkgs.uv}/bin/uv
          '';
        };
      });
    };
}
