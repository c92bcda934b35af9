use super::*;

#[test]
fn the_section_is_off_by_default_and_checked() {
    let config = LoraConfig::default();
    assert!(!config.on_demand);
    assert!(config.validate().is_ok());
    let bad = |f: fn(&mut LoraConfig)| {
        let mut c = LoraConfig::default();
        f(&mut c);
        c.validate().unwrap_err().to_string()
    };
    let e = bad(|c| c.load_timeout_ms = 0);
    assert!(e.contains("lora.load_timeout_ms"), "{e}");
    let e = bad(|c| {
        c.paths.insert("sql".into(), " ".into());
    });
    assert!(e.contains("lora.paths.sql"), "{e}");
    let e = bad(|c| {
        c.paths.insert("base:sql".into(), "/a".into());
    });
    assert!(e.contains("base:sql"), "{e}");
}

#[test]
fn an_engine_s_reason_is_read_from_its_error_body() {
    let vllm = br#"{"error":{"message":"The lora adapter 'x' has already been loaded.","type":"BadRequestError"}}"#;
    assert!(reason(vllm).contains("already been loaded"));
    assert_eq!(reason(br#"{"detail":"Not Found"}"#), "Not Found");
    assert_eq!(reason(b" plain text \n"), "plain text");
}
