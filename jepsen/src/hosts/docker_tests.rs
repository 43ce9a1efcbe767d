use super::setup::parse_ldd;
use super::*;

const LDD: &str = "\
\tlinux-vdso.so.1 (0x00007ffc6b5f2000)
\tlibstdc++.so.6 => /lib/x86_64-linux-gnu/libstdc++.so.6 (0x00007f0a1c000000)
\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f0a1bfe0000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0a1bc00000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f0a1c400000)
";

#[test]
fn ldd_lists_libraries_and_the_loader() {
    let files = parse_ldd(LDD).unwrap();
    assert_eq!(
        files,
        vec![
            PathBuf::from("/lib/x86_64-linux-gnu/libstdc++.so.6"),
            PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
            PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
            PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
        ]
    );
    assert!(parse_ldd("\tstatically linked\n").unwrap().is_empty());
    let missing = parse_ldd("\tlibrocksdb.so.8 => not found\n").unwrap_err();
    assert!(missing.to_string().contains("librocksdb.so.8"));
}

#[test]
fn containers_get_fixed_addresses_and_the_same_arguments() {
    let cfg = DockerConfig::new(PathBuf::from("/bin/true"), PathBuf::from("/tmp/run"));
    assert!(cfg.validate().is_ok());
    let args = cfg.create_args(2).join(" ");
    assert!(args.starts_with("create --name rqj-n2 --hostname rqj-n2 --network rqj-net"));
    assert!(args.contains("--ip 10.232.0.2 "));
    assert!(args.contains("--mount type=bind,src=/tmp/run/node2,dst=/data "));
    assert!(args.contains("src=/tmp/run/cluster.secret,dst=/cluster.secret,readonly"));
    assert!(args.contains(
        "raftq-jepsen:local serve --id 2 --listen 10.232.0.2:7000 --data /data --peers \
         1=http://10.232.0.1:7000,2=http://10.232.0.2:7000,3=http://10.232.0.3:7000 \
         --cluster-secret-file /cluster.secret --cluster-id jepsen"
    ));
    assert!(cfg.is_ours("rqj-n1"));
    assert!(cfg.is_ours("rqj-n12"));
    assert!(!cfg.is_ours("rqj-n"));
    assert!(!cfg.is_ours("rqj-net"));
    assert!(!cfg.is_ours("other-n1"));
    let odd = DockerConfig::new(PathBuf::from("/bin/true"), PathBuf::from("/tmp/a,b"));
    assert!(odd.validate().is_err());
}
