use super::*;
use crate::hosts::net::NetNs;

#[test]
fn layout_names_and_addresses() {
    let mut cfg = NetnsConfig::new(PathBuf::from("/bin/true"), PathBuf::from("/tmp/run"));
    assert!(cfg.validate().is_ok());
    assert_eq!(cfg.netns(2), "rqj-n2");
    assert_eq!(cfg.bridge(), "rqj0");
    assert_eq!(cfg.node_addr(3), Ipv4Addr::new(10, 231, 0, 3));
    assert_eq!(cfg.bridge_addr(), Ipv4Addr::new(10, 231, 0, 254));
    assert_eq!(
        cfg.layout().peers_arg(),
        "1=http://10.231.0.1:7000,2=http://10.231.0.2:7000,3=http://10.231.0.3:7000"
    );
    let nodes = NetnsHosts::net_nodes(&cfg);
    assert_eq!(nodes.len(), 3);
    assert_eq!(nodes[0].ns, Some(NetNs::Named("rqj-n1".into())));
    cfg.prefix = "much-too-long".into();
    assert!(cfg.validate().is_err());
    cfg.prefix = "rqj".into();
    cfg.nodes = 0;
    assert!(cfg.validate().is_err());
}
