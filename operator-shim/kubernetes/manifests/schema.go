// Package manifests generates the Kubernetes install of the ElasticJob
// controller from Go: the CRDs' OpenAPI v3 schemas from the v1alpha1 types
// (structure by reflection, descriptions from the types' doc comments,
// validation from their `kube:"..."` struct tags), the RBAC rules the
// controller needs and nothing more, and its Deployment. The gen program
// (operator-shim/kubernetes/gen) writes them into examples/kubernetes/,
// and a test fails when the committed files differ from what it generates.
package manifests

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// docs maps "Type" and "Type.Field" to the doc comment of a type or field
// of a Go source file, as one line.
type docs map[string]string

// parseDocs reads the doc comments of the struct types of src.
func parseDocs(src string) (docs, error) {
	f, err := parser.ParseFile(token.NewFileSet(), "types.go", src, parser.ParseComments)
	if err != nil {
		return nil, fmt.Errorf("parse the API types: %w", err)
	}
	d := docs{}
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.TYPE {
			continue
		}
		for _, s := range g.Specs {
			ts := s.(*ast.TypeSpec)
			doc := ts.Doc
			if doc == nil && len(g.Specs) == 1 {
				doc = g.Doc
			}
			d[ts.Name.Name] = oneLine(doc)
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				continue
			}
			for _, fld := range st.Fields.List {
				for _, n := range fld.Names {
					d[ts.Name.Name+"."+n.Name] = oneLine(fld.Doc)
				}
			}
		}
	}
	return d, nil
}

func oneLine(g *ast.CommentGroup) string {
	if g == nil {
		return ""
	}
	return strings.Join(strings.Fields(g.Text()), " ")
}

var (
	timeType     = reflect.TypeOf(metav1.Time{})
	objectMeta   = reflect.TypeOf(metav1.ObjectMeta{})
	typeMeta     = reflect.TypeOf(metav1.TypeMeta{})
	podTemplate  = reflect.TypeOf(corev1.PodTemplateSpec{})
	errNoSchemaT = fmt.Errorf("no schema for this Go type")
)

// schemaOf is the structural schema of Go type t; d gives descriptions.
// ValidationRules (CEL) are added by type name.
func schemaOf(t reflect.Type, d docs, rules map[string][]apiextv1.ValidationRule) (apiextv1.JSONSchemaProps, error) {
	switch t {
	case timeType:
		return apiextv1.JSONSchemaProps{Type: "string", Format: "date-time"}, nil
	case objectMeta:
		return apiextv1.JSONSchemaProps{Type: "object"}, nil
	case podTemplate:
		// The pod template is checked by the API server when the pod is
		// created (the controller reports the error in the status); the
		// CRD keeps its fields as written.
		return apiextv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr(true)}, nil
	}
	switch t.Kind() {
	case reflect.Pointer:
		return schemaOf(t.Elem(), d, rules)
	case reflect.String:
		return apiextv1.JSONSchemaProps{Type: "string"}, nil
	case reflect.Bool:
		return apiextv1.JSONSchemaProps{Type: "boolean"}, nil
	case reflect.Int32:
		return apiextv1.JSONSchemaProps{Type: "integer", Format: "int32"}, nil
	case reflect.Int64, reflect.Int:
		return apiextv1.JSONSchemaProps{Type: "integer", Format: "int64"}, nil
	case reflect.Slice:
		item, err := schemaOf(t.Elem(), d, rules)
		if err != nil {
			return item, err
		}
		return apiextv1.JSONSchemaProps{Type: "array", Items: &apiextv1.JSONSchemaPropsOrArray{Schema: &item}}, nil
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			return apiextv1.JSONSchemaProps{}, fmt.Errorf("%s: %w", t, errNoSchemaT)
		}
		v, err := schemaOf(t.Elem(), d, rules)
		if err != nil {
			return v, err
		}
		return apiextv1.JSONSchemaProps{Type: "object", AdditionalProperties: &apiextv1.JSONSchemaPropsOrBool{Allows: true, Schema: &v}}, nil
	case reflect.Struct:
		return structSchema(t, d, rules)
	}
	return apiextv1.JSONSchemaProps{}, fmt.Errorf("%s: %w", t, errNoSchemaT)
}

func structSchema(t reflect.Type, d docs, rules map[string][]apiextv1.ValidationRule) (apiextv1.JSONSchemaProps, error) {
	s := apiextv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextv1.JSONSchemaProps{}, XValidations: rules[t.Name()]}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Type == typeMeta {
			s.Properties["apiVersion"] = apiextv1.JSONSchemaProps{Type: "string", Description: "APIVersion defines the versioned schema of this representation of an object."}
			s.Properties["kind"] = apiextv1.JSONSchemaProps{Type: "string", Description: "Kind is a string value representing the REST resource this object represents."}
			continue
		}
		if name == "" || name == "-" {
			return s, fmt.Errorf("%s.%s: needs a json name", t.Name(), f.Name)
		}
		p, err := schemaOf(f.Type, d, rules)
		if err != nil {
			return s, fmt.Errorf("%s.%s: %w", t.Name(), f.Name, err)
		}
		if f.Type != objectMeta {
			p.Description = d[t.Name()+"."+f.Name]
		}
		required, err := applyTag(&p, f.Tag.Get("kube"))
		if err != nil {
			return s, fmt.Errorf("%s.%s: kube tag: %w", t.Name(), f.Name, err)
		}
		if required {
			s.Required = append(s.Required, name)
		}
		s.Properties[name] = p
	}
	return s, nil
}

// applyTag applies a `kube:"..."` tag: comma-separated required, min=,
// max=, minLength=, maxLength=, pattern=, enum=a|b, maxItems=, itemMin=
// (minimum of each item). A pattern may not contain a comma.
func applyTag(p *apiextv1.JSONSchemaProps, tag string) (required bool, err error) {
	if tag == "" {
		return false, nil
	}
	for _, part := range strings.Split(tag, ",") {
		k, v, _ := strings.Cut(part, "=")
		num := func() (float64, error) { return strconv.ParseFloat(v, 64) }
		count := func() (*int64, error) {
			n, err := strconv.ParseInt(v, 10, 64)
			return &n, err
		}
		switch k {
		case "required":
			required = true
		case "min", "max", "itemMin":
			n, err := num()
			if err != nil {
				return false, fmt.Errorf("%s: %w", part, err)
			}
			switch k {
			case "min":
				p.Minimum = &n
			case "max":
				p.Maximum = &n
			default:
				if p.Items == nil || p.Items.Schema == nil {
					return false, fmt.Errorf("%s: not an array", part)
				}
				p.Items.Schema.Minimum = &n
			}
		case "minLength", "maxLength", "maxItems":
			n, err := count()
			if err != nil {
				return false, fmt.Errorf("%s: %w", part, err)
			}
			switch k {
			case "minLength":
				p.MinLength = n
			case "maxLength":
				p.MaxLength = n
			default:
				p.MaxItems = n
			}
		case "pattern":
			p.Pattern = v
		case "enum":
			for _, e := range strings.Split(v, "|") {
				b, _ := json.Marshal(e)
				p.Enum = append(p.Enum, apiextv1.JSON{Raw: b})
			}
		default:
			return false, fmt.Errorf("unknown key %q", k)
		}
	}
	return required, nil
}

func ptr[T any](v T) *T { return &v }
