//! Throwaway certificates made with the `openssl` command for a test: CAs,
//! and leaves signed by them for the names a test needs.

use std::path::{Path, PathBuf};

pub async fn openssl(dir: &Path, args: &[&str]) {
    let out = tokio::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .await
        .expect("openssl runs (scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const EC: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

/// A self-signed CA: `<name>.pem` and `<name>.key` in `dir`.
pub async fn ca(dir: &Path, name: &str) -> PathBuf {
    let (key, pem, subj) = (
        format!("{name}.key"),
        format!("{name}.pem"),
        format!("/CN={name}"),
    );
    let mut args = vec!["req", "-x509"];
    args.extend(EC);
    args.extend(["-keyout", &key, "-out", &pem, "-days", "2", "-subj", &subj]);
    openssl(dir, &args).await;
    dir.join(pem)
}

/// A leaf for server and client use, signed by CA `ca`, valid for `sans`
/// (`IP:127.0.0.1`, `DNS:localhost`, …): `<name>.pem` and `<name>.key`.
pub async fn leaf(dir: &Path, ca: &str, name: &str, sans: &str) -> (PathBuf, PathBuf) {
    let (key, csr, pem, ext, subj) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
        format!("{name}.ext"),
        format!("/CN={name}"),
    );
    let mut args = vec!["req"];
    args.extend(EC);
    args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
    openssl(dir, &args).await;
    std::fs::write(
        dir.join(&ext),
        format!("subjectAltName={sans}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n"),
    )
    .expect("ext file");
    let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "1",
            "-extfile",
            &ext,
        ],
    )
    .await;
    (dir.join(pem), dir.join(key))
}
